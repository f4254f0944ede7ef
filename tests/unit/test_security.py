"""The CA and certificates made at set-up, the secrets directory, and the permission
table's invariants (the server enforcing it: tests/integration/test_bus_security.py)."""

from __future__ import annotations

import json
import ssl
import stat

import pytest
import structlog
from cryptography import x509

from koi import subjects
from koi.subjects import subject_matches
from services.runtime import permissions
from services.runtime.permissions import ADMIN, CLIENT, ROLES
from services.runtime.permissions import permissions as permissions_of
from services.runtime.security import ensure_pki, init_command, init_security, tls_context
from services.runtime.settings import SERVICES


def _may_publish(role: str, subject: str) -> bool:
    return any(subject_matches(p, subject) for p in permissions_of(role).publish)


def test_pki_is_made_once_owner_only_and_verifies(tmp_path) -> None:
    pki = ensure_pki(tmp_path / "pki", sans=("nats.messaging.svc", "10.0.0.7"))
    files = (pki.ca_cert, pki.ca_key, pki.server_cert, pki.server_key)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    before = [f.read_bytes() for f in files]
    ensure_pki(tmp_path / "pki", sans=("10.0.0.7",))  # already covered
    assert [f.read_bytes() for f in files] == before  # nothing re-issued
    cert = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "nats.messaging.svc"} <= set(names.get_values_for_type(x509.DNSName))
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1",
                                                                            "10.0.0.7"}
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()))
    assert isinstance(tls_context(pki.ca_cert), ssl.SSLContext)


def test_a_new_name_reissues_the_server_certificate_under_the_same_ca(tmp_path) -> None:
    pki = ensure_pki(tmp_path)
    ca, server = pki.ca_cert.read_bytes(), pki.server_cert.read_bytes()
    ensure_pki(tmp_path, sans=("nats",))
    assert pki.ca_cert.read_bytes() == ca and pki.server_cert.read_bytes() != server


def test_init_security_gives_each_role_a_distinct_secret_and_keeps_it(tmp_path) -> None:
    sec = init_security(tmp_path, mount=tmp_path)
    passwords = sec.passwords()
    assert set(passwords) == set(ROLES) and len(set(passwords.values())) == len(ROLES)
    assert init_security(tmp_path).passwords() == passwords  # idempotent
    for path in (*tmp_path.rglob("password"), tmp_path / "nats.conf",
                 tmp_path / "nats-auth.conf"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    env = sec.env_for("placer")
    assert env["KOI_NATS_USER"] == "placer" and env["KOI_NATS_PASSWORD"] == ""
    assert passwords["placer"] not in str(env) and passwords["placer"] not in repr(sec.auth(
        "placer"))


def test_init_makes_the_grpc_token_once_owner_only_and_never_prints_it(tmp_path) -> None:
    with structlog.testing.capture_logs() as logs:
        out = init_command(tmp_path, sans=("planner-api",))
        sec = init_security(tmp_path)
    token = sec.grpc_token_file.read_text()
    assert len(token) >= 40 and token.strip() == token  # 32 random bytes, url-safe
    for path in (sec.grpc_token_file, sec.grpc_cert, sec.grpc_key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    again = init_command(tmp_path, sans=("planner-api", "planner-api.koi.svc"))
    assert sec.grpc_token_file.read_text() == token  # kept across runs
    assert token not in out and token not in again and str(sec.grpc_token_file) in out
    assert token not in repr(sec) and token not in repr(logs)


def test_the_grpc_files_follow_a_reissued_server_certificate(tmp_path) -> None:
    sec = init_security(tmp_path, sans=("nats",))
    before = sec.grpc_cert.read_bytes()
    sec = init_security(tmp_path, sans=("nats", "planner-api"))
    assert sec.grpc_cert.read_bytes() != before
    assert sec.grpc_cert.read_bytes() == sec.pki.grpc_cert.read_bytes()
    assert sec.grpc_key.read_bytes() == sec.pki.grpc_key.read_bytes()
    cert = x509.load_pem_x509_certificate(sec.grpc_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "planner-api" in names.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize("stage", subjects.STAGES)
def test_each_stage_has_exactly_one_publisher(stage: str) -> None:
    subject = subjects.tick_subject(5, stage)
    assert [r for r in ROLES if r != ADMIN and _may_publish(r, subject)] == [
        {"snapshot": "sim", "observations": "telemetry-ingest", "causal": "causal-store",
         "candidates": "proposer", "plan": "evaluator", "actions": "placer",
         "hypotheses": "proposer"}[stage]]


def test_the_lease_and_the_causal_kv_have_one_writer_each() -> None:
    lease = permissions.kv_subject(subjects.KV_LEASES, subjects.KEY_PLACER_LEASE)
    causal = permissions.kv_subject(subjects.KV_CAUSAL, subjects.KEY_CAUSAL_STATE)
    assert [r for r in ROLES if r != ADMIN and _may_publish(r, lease)] == ["placer"]
    assert [r for r in ROLES if r != ADMIN and _may_publish(r, causal)] == ["causal-store"]


def test_the_client_may_submit_and_read_events_and_jobs_only() -> None:
    assert _may_publish(CLIENT, subjects.job_submit_subject(CLIENT))
    for subject in (subjects.job_accepted_subject("j"), subjects.event_subject("info", "x"),
                    "$JS.API.STREAM.INFO.KOI_TICKS", "$JS.API.STREAM.DELETE.KOI_EVENTS",
                    "$JS.API.CONSUMER.CREATE.KOI_TICKS"):
        assert not _may_publish(CLIENT, subject), subject
    assert _may_publish(CLIENT, "$JS.API.CONSUMER.CREATE.KOI_EVENTS")
    assert permissions_of(CLIENT).subscribe == ("_INBOX.>",)


def test_a_submitter_may_submit_on_its_own_subject_only() -> None:
    alice = permissions.submitter("alice")
    mine = [p for p in alice.publish if p.startswith(subjects.JOBS_SUBMIT_PREFIX)]
    assert mine == [subjects.job_submit_subject("alice")]
    assert not any(subject_matches(p, subjects.job_submit_subject("bob"))
                   for p in alice.publish)
    assert not _may_publish(CLIENT, subjects.job_submit_subject("alice"))
    assert permissions.submitter(CLIENT) == permissions_of(CLIENT)
    # the same reads as the client: events and the jobs stream, nothing else
    assert alice.publish[1:] == permissions_of(CLIENT).publish[1:]
    assert alice.subscribe == ("_INBOX.>",) and not alice.responds
    # no service publishes on anyone's submit subject; the placer alone answers them
    for role in SERVICES:
        assert not _may_publish(role, subjects.job_submit_subject("alice")), role
    assert permissions.RESPONDERS[subjects.JOBS_SUBMIT_ANY] == "placer"


@pytest.mark.parametrize("name", ["placer", ADMIN, "a.b", "*", ">", "", "x" * 65])
def test_a_submitter_cannot_take_a_roles_name_or_span_tokens(name: str) -> None:
    with pytest.raises(ValueError):
        permissions.submitter(name)


def test_init_adds_submitters_keeps_them_and_writes_them_into_the_config(tmp_path) -> None:
    sec = init_security(tmp_path, submitters=("alice",))
    assert sec.submitters() == ("alice",)
    sec = init_security(tmp_path, submitters=("bob", CLIENT))   # alice is kept
    assert sec.submitters() == ("alice", "bob") and set(sec.users()) == {*ROLES, "alice",
                                                                          "bob"}
    passwords = sec.passwords()
    assert len(set(passwords.values())) == len(passwords)
    conf = (tmp_path / "nats-auth.conf").read_text()
    users = json.loads(conf.split("users: ", 1)[1].rsplit("\n  }", 1)[0])
    by_name = {u["user"]: u for u in users}
    assert by_name["bob"]["permissions"]["publish"]["allow"][0] == "koi.jobs.submit.bob"
    assert by_name[CLIENT]["permissions"]["publish"]["allow"][0] == "koi.jobs.submit.client"
    assert all(p not in conf for p in passwords.values())
    with pytest.raises(ValueError, match="cannot be a submitter"):
        init_security(tmp_path, submitters=("evaluator",))


@pytest.mark.parametrize("role", SERVICES)
def test_no_service_may_delete_purge_or_update_koi_streams(role: str) -> None:
    for stream in (*subjects.STREAMS, *(f"KV_{b}" for b in subjects.KV_BUCKETS)):
        for verb in ("DELETE", "PURGE", "UPDATE"):
            assert not _may_publish(role, f"$JS.API.STREAM.{verb}.{stream}"), (verb, stream)
        assert not _may_publish(role, f"$JS.API.STREAM.MSG.DELETE.{stream}")
        assert not _may_publish(role, f"$JS.API.CONSUMER.DELETE.{stream}.placer")


def test_only_responders_may_listen_on_request_subjects() -> None:
    for subject, responder in permissions.RESPONDERS.items():
        for role in SERVICES:
            perms = permissions_of(role)
            assert (subject in perms.subscribe_deny) == (role != responder), (role, subject)
            assert perms.responds == (role in permissions.RESPONDERS.values())


def test_the_kv_keys_and_durables_agree_with_the_services() -> None:
    from services.engine_metrics.main import DURABLE as ENGINE_METRICS_DURABLE
    from services.engine_metrics.main import KEY_SIM_METRICS
    from services.evaluator.main import KEY_CACHE_STATS
    from services.planner_api.main import KEY_ADDR
    from services.sim.main import JOBS_DURABLE, KEY_METRICS

    assert permissions.KEY_EVALUATOR_CACHE == KEY_CACHE_STATS
    assert permissions.KEY_PLANNER_API_ADDR == KEY_ADDR
    assert (subjects.STREAM_JOBS, JOBS_DURABLE) in permissions.DURABLES["sim"]
    assert (subjects.STREAM_TICKS, ENGINE_METRICS_DURABLE) in \
        permissions.DURABLES["engine-metrics"]
    assert KEY_SIM_METRICS == KEY_METRICS   # the sim writes where engine-metrics reads


def test_telemetry_is_published_by_the_world_and_the_engine_adapter_only() -> None:
    subject = subjects.telemetry_subject(5)
    publishers = [r for r in ROLES if r != ADMIN and _may_publish(r, subject)]
    assert publishers == ["sim", "engine-metrics"]   # telemetry-ingest only reads it
    kv_sim = permissions.kv_subject(subjects.KV_SIM, "metrics")
    assert not _may_publish("engine-metrics", kv_sim)   # it reads the sim's address only


@pytest.mark.parametrize("role", SERVICES)
def test_every_service_may_write_its_own_start_up_keys_only(role: str) -> None:
    from services.runtime.app import process_key, ready_key

    other = next(r for r in SERVICES if r != role)
    for key in (ready_key(role), process_key(role, 0), process_key(role, 3)):
        assert _may_publish(role, permissions.kv_subject(subjects.KV_SIM, key)), key
    if role != "sim":  # the sim owns koi_sim
        for key in (ready_key(other), process_key(other, 0)):
            assert not _may_publish(role, permissions.kv_subject(subjects.KV_SIM, key)), key


def test_nats_and_grpc_have_their_own_certificates_and_keys(tmp_path) -> None:
    sec = init_security(tmp_path, sans=("nats", "planner-api"))
    nats_key, grpc_key = sec.pki.server_key.read_bytes(), sec.grpc_key.read_bytes()
    assert nats_key != grpc_key and sec.pki.server_cert.read_bytes() != sec.grpc_cert.read_bytes()
    ca = x509.load_pem_x509_certificate(sec.pki.ca_cert.read_bytes())
    for path in (sec.pki.server_cert, sec.grpc_cert):
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)
    # planner-api's directory holds nothing of NATS's: no NATS key, no password
    for path in sec.grpc_dir.iterdir():
        assert path.read_bytes() != nats_key
        assert not any(p.encode() in path.read_bytes() for p in sec.passwords().values())


def test_the_server_configuration_holds_bcrypt_hashes_not_passwords(tmp_path) -> None:
    import bcrypt

    sec = init_security(tmp_path)
    conf = (tmp_path / "nats-auth.conf").read_text()
    hashes = sec.password_hashes()
    for role, password in sec.passwords().items():
        assert password not in conf
        assert hashes[role] in conf and hashes[role].startswith("$2a$")
        assert bcrypt.checkpw(password.encode(), hashes[role].encode())
        assert stat.S_IMODE(sec.hash_file(role).stat().st_mode) == 0o600
    assert init_security(tmp_path).password_hashes() == hashes  # not re-hashed
