"""docs/SETTINGS.md is the settings models written out: regenerate it with
``koi settings --markdown > docs/SETTINGS.md`` when a setting changes."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from services.koi_command import app
from services.runtime.settings import ENV
from services.runtime.settings_doc import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "SETTINGS.md"


def test_the_settings_page_is_current() -> None:
    assert DOC.read_text(encoding="utf-8") == markdown(), (
        "docs/SETTINGS.md is stale: run `koi settings --markdown > docs/SETTINGS.md`")


def test_the_page_names_every_variable() -> None:
    text = markdown()
    missing = [name for name in ENV if f"| `{name}` |" not in text]
    assert not missing


def test_koi_settings_prints_the_page() -> None:
    result = CliRunner().invoke(app, ["settings", "--markdown"])
    assert result.exit_code == 0 and result.output == markdown()


def test_koi_settings_shows_values_but_no_secret(monkeypatch) -> None:
    monkeypatch.setenv("KOI_NATS_URL", "nats://placer:s3cret@nats:4222")
    monkeypatch.setenv("KOI_NATS_PASSWORD", "s3cret")
    monkeypatch.setenv("KOI_REPLICA", "2")
    out = CliRunner().invoke(app, ["settings"]).output
    assert "s3cret" not in out
    assert "KOI_NATS_PASSWORD=(set)" in out and "KOI_REPLICA=2\n" in out
    assert "KOI_STAGE_DEADLINE_S=60 (default)" in out
