"""The figures README.md states about the catalog and the decision space are the
catalog's and the space's own: a count that drifts fails here, not in a reader's hands."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from koi.catalog import load_catalog
from koi.space import DeploymentConfig

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _stated(pattern: str) -> int:
    found = re.search(pattern, README)
    assert found, f"README no longer states {pattern!r}: update this test with it"
    return int(found.group(1))


def test_catalog_figures() -> None:
    cat = load_catalog()
    offerings = list(cat.offerings.values())
    assert _stated(r"catalog: (\d+) accelerators") == len(cat.accelerators)
    assert _stated(r"(\d+) offerings on") == len(offerings)
    assert _stated(r"on (\d+) clouds") == len({o.cloud for o in offerings})
    assert _stated(r"in (\d+) regions") == len({(o.cloud, o.region) for o in offerings})
    assert _stated(r"(\d+) model architectures") == len(cat.models)
    assert _stated(r"(\d+) engines") == len(cat.engines)


def test_decision_space_figure() -> None:
    assert _stated(r"`DeploymentConfig`, (\d+) knobs") == len(dataclasses.fields(DeploymentConfig))
