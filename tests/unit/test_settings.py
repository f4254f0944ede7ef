"""Settings from the environment: bounds on every number, NATS credentials that never
show, and URLs whose passwords never reach a log line."""

from __future__ import annotations

import re

import pytest

from services.runtime.settings import ENV, NatsAuth, ServiceSettings, redact_url, variable_fields


def test_defaults_are_accepted() -> None:
    settings = ServiceSettings.from_env({})
    assert settings.stage_deadline_s == 60.0 and settings.nats_auth == NatsAuth()


@pytest.mark.parametrize(("name", "value"), [
    ("KOI_STAGE_DEADLINE_S", "-1"), ("KOI_STAGE_DEADLINE_S", "0"),
    ("KOI_STAGE_DEADLINE_S", "nan"), ("KOI_STAGE_DEADLINE_S", "inf"),
    ("KOI_LEASE_TTL_S", "-5"), ("KOI_REPLICA", "-1"), ("KOI_EVAL_SHARD", "0"),
    ("KOI_SEED", "-3"), ("KOI_HORIZON_S", "-60"), ("KOI_SAMPLE_FRACTION", "1.5"),
    ("KOI_SAMPLE_FRACTION", "0"), ("KOI_EVAL_SHARD", "two"),
    ("KOI_SIM_METRICS_PORT", "70000"), ("KOI_SIM_METRICS_PORT", "-1"),
    ("KOI_SCRAPE_CONCURRENCY", "0"), ("KOI_SCRAPE_TIMEOUT_S", "0"),
    ("KOI_METRICS_SOURCE", "carrier-pigeon"), ("KOI_PROMETHEUS_URL", "file:///etc/passwd"),
    ("KOI_METRICS_TARGETS_URL", "http://"),
])
def test_a_number_out_of_bounds_is_refused_with_its_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        ServiceSettings.from_env({name: value})


def test_every_numeric_variable_has_bounds_and_its_default_is_within() -> None:
    """Each number is bounded on both sides by its field (pydantic ``ge``/``gt`` and
    ``le``/``lt``), and every variable is declared in ``ENV`` with a description."""
    info = ServiceSettings.__pydantic_fields__  # type: ignore[attr-defined]
    numeric = [n for n in variable_fields()
               if any(t in str(info[n].annotation) for t in ("int", "float"))]
    assert {"seed", "horizon_s", "sample_fraction", "stage_deadline_s", "replica",
            "lease_ttl_s", "eval_shard", "sim_metrics_port"} <= set(numeric)
    for name in numeric:
        kinds = {type(m).__name__ for m in info[name].metadata}
        assert kinds & {"Ge", "Gt"} and kinds & {"Le", "Lt"}, f"{name} has no bounds: {kinds}"
    for name in variable_fields():
        assert ENV[f"KOI_{name.upper()}"][1], f"KOI_{name.upper()} has no description"
    ServiceSettings.from_env({})  # every default passes its own bounds


def test_engine_metrics_settings_are_off_by_default_and_read_when_set() -> None:
    off = ServiceSettings.from_env({})
    assert off.sim_metrics_port is None and off.metrics_source == "scrape"
    on = ServiceSettings.from_env({"KOI_SIM_METRICS_PORT": "0",
                                   "KOI_METRICS_SOURCE": "prometheus",
                                   "KOI_PROMETHEUS_URL": "http://user:pw@prom:9090"})
    assert on.sim_metrics_port == 0 and on.prometheus_url == "http://user:pw@prom:9090"
    assert "pw" not in repr(on)   # a URL's credentials stay out of the repr


def test_nats_credentials_from_a_password_file_never_show(tmp_path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret-value\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    auth = ServiceSettings.from_env({"KOI_NATS_USER": "placer",
                                     "KOI_NATS_PASSWORD_FILE": str(secret),
                                     "KOI_NATS_CA": str(ca)}).nats_auth
    assert auth == NatsAuth("placer", "s3cret-value", str(ca))
    assert "s3cret" not in repr(auth) and "s3cret" not in repr(ServiceSettings.from_env(
        {"KOI_NATS_USER": "placer", "KOI_NATS_PASSWORD": "s3cret"}))


@pytest.mark.parametrize(("environ", "match"), [
    ({"KOI_NATS_USER": "placer"}, "go together"),
    ({"KOI_NATS_PASSWORD": "s3cret"}, "go together"),
    ({"KOI_NATS_USER": "placer", "KOI_NATS_PASSWORD": "s3cret",
      "KOI_NATS_PASSWORD_FILE": "/x"}, "not both"),
    ({"KOI_NATS_USER": "placer", "KOI_NATS_PASSWORD_FILE": "/no/such/file"}, "cannot be read"),
    ({"KOI_NATS_USER": "a b", "KOI_NATS_PASSWORD": "s3cret"}, "KOI_NATS_USER"),
    ({"KOI_NATS_CA": "/no/such/ca.pem"}, "KOI_NATS_CA"),
])
def test_bad_nats_credentials_are_refused_without_the_secret(environ, match) -> None:
    with pytest.raises(ValueError, match=match) as err:
        NatsAuth.from_env(environ)
    assert "s3cret" not in str(err.value)


def test_redact_url_hides_userinfo_of_every_server() -> None:
    url = "tls://placer:s3cret@nats-a:4222,nats://u:p@nats-b:4222,nats://nats-c:4222"
    assert redact_url(url) == "tls://***@nats-a:4222,nats://***@nats-b:4222,nats://nats-c:4222"


@pytest.mark.parametrize(("environ", "text"), [
    ({"KOI_GRPC_HEALTH_ADDR": "50052"}, "KOI_GRPC_HEALTH_ADDR='50052' is not a host:port"),
    ({"KOI_GRPC_HEALTH_ADDR": "0.0.0.0:http"}, "KOI_GRPC_HEALTH_ADDR='0.0.0.0:http'"),
    ({"KOI_GRPC_HEALTH_ADDR": "0.0.0.0:70000"}, "port 0-65535"),
    ({"KOI_GRPC_ADDR": "localhost"}, "KOI_GRPC_ADDR='localhost' is not a host:port"),
    ({"KOI_GRPC_ADDR": "0.0.0.0:50051", "KOI_GRPC_HEALTH_ADDR": "127.0.0.1:50051"},
     "uses KOI_GRPC_ADDR's port"),
])
def test_a_bad_grpc_address_is_refused_with_its_name(environ, text) -> None:
    with pytest.raises(ValueError, match=re.escape(text)):
        ServiceSettings.from_env(environ)


def test_the_grpc_health_address_is_off_by_default_and_read_when_set() -> None:
    assert ServiceSettings.from_env({}).grpc_health_addr == ""
    settings = ServiceSettings.from_env({"KOI_GRPC_ADDR": "0.0.0.0:50051",
                                         "KOI_GRPC_HEALTH_ADDR": "0.0.0.0:50052"})
    assert settings.grpc_health_addr == "0.0.0.0:50052"
    both_free = ServiceSettings.from_env({"KOI_GRPC_ADDR": "127.0.0.1:0",
                                          "KOI_GRPC_HEALTH_ADDR": "127.0.0.1:0"})
    assert both_free.grpc_health_addr == "127.0.0.1:0"  # two free ports, not one
