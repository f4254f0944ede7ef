"""How long ``koi plan``'s cluster read takes to fail, per cause, with the default
timeouts and retries (KOI_K8S_CONNECT_TIMEOUT_S, KOI_K8S_READ_TIMEOUT_S, KOI_K8S_RETRIES)
against the failing stand-ins of tests/support/k8s_faults.py: median of ``--runs`` runs.

    .venv/bin/python scripts/k8s_failure_times.py [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from koi.catalog import load_catalog
from koi.cluster import PlanDecision
from services.k8s_backend import (
    KubernetesBackend,
    api_client,
    describe_failure,
    server_of,
)
from services.runtime.security import ensure_pki
from services.runtime.settings import ServiceSettings
from support import k8s_faults as faults


@contextlib.contextmanager
def _bad_ca(tmp: Path) -> Iterator[tuple[str | None, str | None]]:
    theirs, ours = ensure_pki(tmp / "server"), ensure_pki(tmp / "other")
    with faults.answering(403, faults.forbidden_message(), cert=theirs.server_cert,
                          key=theirs.server_key) as url:
        yield None, str(faults.kubeconfig(tmp / "kc", url, ours.ca_cert))


@contextlib.contextmanager
def _url(cm: contextlib.AbstractContextManager[str]) -> Iterator[tuple[str | None, None]]:
    with cm as url:
        yield url, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    s = ServiceSettings.from_env()
    catalog = load_catalog()
    cases = {
        "refused": lambda tmp: _url(faults.refusing()),
        "never answers": lambda tmp: _url(faults.silent()),
        "401": lambda tmp: _url(faults.answering(401, "Unauthorized")),
        "403": lambda tmp: _url(faults.answering(403, faults.forbidden_message())),
        "bad CA": _bad_ca,
    }
    print(f"connect {s.k8s_connect_timeout_s:g} s, read {s.k8s_read_timeout_s:g} s, "
          f"retries {s.k8s_retries}; median of {args.runs}")
    print("| case | cause named | seconds to fail |\n|---|---|---:|")
    for name, make in cases.items():
        times, cause = [], ""
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp, make(Path(tmp)) as (url, kc):
                api = api_client(url, kubeconfig=kc, retries=s.k8s_retries)
                backend = KubernetesBackend(api, catalog,
                                            connect_timeout_s=s.k8s_connect_timeout_s,
                                            read_timeout_s=s.k8s_read_timeout_s)
                t0 = time.perf_counter()
                try:
                    backend.plan(PlanDecision(0, ()))
                except Exception as e:  # every failure is the measurement
                    cause = describe_failure(e, server_of(api)).cause
                times.append(time.perf_counter() - t0)
        print(f"| {name} | {cause} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
