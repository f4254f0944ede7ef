"""``koi plan`` / the K8s backend against API servers that fail: each failure names its
cause (refused, timeout, TLS, auth, forbidden), the server's URL and, where the API
sent one, its Status message; and it fails in seconds, not urllib3's minutes (the
timings are in docs/RELIABILITY.md, measured by scripts/k8s_failure_times.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from koi.catalog import load_catalog
from koi.cluster import PlanDecision
from services.k8s_backend import KubernetesBackend, api_client, describe_failure, server_of
from services.runtime.security import ensure_pki
from support import k8s_faults as faults

pytestmark = pytest.mark.timeout(120)


def _plan(url: str | None = None, kubeconfig: Path | None = None, read_timeout_s: float = 1.0):
    """What ``KubernetesBackend.plan`` raised, as a ``ClusterFailure``."""
    api = api_client(url, kubeconfig=str(kubeconfig) if kubeconfig else None, retries=0)
    backend = KubernetesBackend(api, load_catalog(), connect_timeout_s=1.0,
                                read_timeout_s=read_timeout_s)
    with pytest.raises(Exception) as info:
        backend.plan(PlanDecision(0, ()))
    return describe_failure(info.value, server_of(api))


def test_a_refused_connection_says_refused_and_where() -> None:
    with faults.refusing() as url:
        f = _plan(url)
    assert (f.cause, f.server) == ("refused", url)
    assert "running at that address" in f.hint


def test_a_server_that_never_answers_is_a_timeout() -> None:
    with faults.silent() as url:
        f = _plan(url, read_timeout_s=0.5)
    assert (f.cause, f.server) == ("timeout", url) and "no answer" in f.detail


@pytest.mark.parametrize(("code", "cause"), [(401, "auth"), (403, "forbidden")])
def test_the_api_status_message_is_kept(code: int, cause: str) -> None:
    message = faults.forbidden_message() if code == 403 else "Unauthorized"
    with faults.answering(code, message) as url:
        f = _plan(url)
    assert (f.cause, f.server) == (cause, url)
    assert f"HTTP {code}" in f.detail and message in f.detail


def test_a_server_certificate_from_another_ca_is_a_tls_failure(tmp_path: Path) -> None:
    theirs, ours = ensure_pki(tmp_path / "server"), ensure_pki(tmp_path / "other")
    with faults.answering(403, faults.forbidden_message(), cert=theirs.server_cert,
                          key=theirs.server_key) as url:
        f = _plan(kubeconfig=faults.kubeconfig(tmp_path / "kc", url, ours.ca_cert))
        trusted = _plan(kubeconfig=faults.kubeconfig(tmp_path / "ok", url, theirs.ca_cert))
    assert (f.cause, f.server) == ("tls", url) and "certificate" in f.detail
    assert trusted.cause == "forbidden"  # the right CA gets through, to RBAC's answer


def test_koi_plan_prints_the_cause_and_the_status_message(tmp_path: Path) -> None:
    from services.plan_cmd import plan_command

    lines: list[str] = []
    with faults.answering(403, faults.forbidden_message()) as url:
        code = plan_command(backend="k8s", apply=False, server_dry_run=False,
                            scenario="hetero-3h", tick=0, seed=1, policy="fcfs-first-fit",
                            kube_url=url, kubeconfig=None, namespace="koi",
                            options_file=None, echo=lines.append)
    assert code == 2
    (line,) = lines
    assert line.startswith(f"koi plan: cannot read the cluster: forbidden at {url}: HTTP 403")
    assert 'User "alice" cannot list resource "deployments"' in line


def test_an_api_exception_without_a_body_still_names_the_status() -> None:
    f = describe_failure(ApiException(status=500, reason="Internal Server Error"), "u")
    assert (f.cause, f.detail) == ("http", "HTTP 500 Internal Server Error")
