"""The deployment files in compose/ agree with the code they deploy.

Checks docker-compose.yml, compose/k8s/*.yaml, the Dockerfile and compose/README.md
against ``services/runtime/settings.py``: every service in ``SERVICES`` has a compose
service and a Kubernetes Deployment, nothing runs Koi under a name ``SERVICES`` lacks,
every ``KOI_*`` variable named is declared in ``ENV``, the replicas, ports, probes and
labels are what DESIGN §2 and §5 ask for, and planner-api's gRPC runs with TLS and a
token from mounted secrets, probed on its plaintext health-only port. The service list always comes from
``SERVICES``, so a new service without manifests fails here. Files are parsed only:
no docker, no cluster.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.runtime.settings import ENV, SERVICES

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
K8S_DIR = COMPOSE_DIR / "k8s"
README = COMPOSE_DIR / "README.md"

INFRA = {"nats", "redis"}  # compose services that are not Koi's
SETUP = "koi-secrets"      # compose's one-shot `koi security init` (CA, users, nats.conf)
SECRETS_DIR = "/run/secrets/koi"  # where a service finds its NATS password and the CA
IMAGE = "koi:latest"
NAMESPACE = "koi"
CONFIG_MAP = "koi-config"
SCALED_OUT = {"proposer": 2, "evaluator": 2}  # queue groups (DESIGN §2)
K8S_SCALED_OUT = {**SCALED_OUT, "placer": 2}  # + leader and standby (DESIGN §5)
GRPC_PORT = int(ENV["KOI_GRPC_ADDR"][0].rpartition(":")[2])
GRPC_HEALTH_PORT = 50052  # planner-api's plaintext, health-only port in both
GRPC_FILES = ("KOI_GRPC_TLS_CERT", "KOI_GRPC_TLS_KEY", "KOI_GRPC_TOKEN_FILE")
KOI_VAR = re.compile(r"\bKOI_[A-Z0-9_]+\b")


# ---- loading -------------------------------------------------------------------------

def compose_services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def runs_koi(service: dict[str, Any]) -> bool:
    build = service.get("build") or {}
    return (isinstance(build, dict) and build.get("dockerfile") == "compose/Dockerfile") or \
        str(service.get("image", "")).startswith("koi")


def k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(K8S_DIR.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return deployment["spec"]["template"]["spec"]["containers"]


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=VALUE list form
        return dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e.get("value", "")) for e in container.get("env", [])}


def koi_container(name: str) -> dict[str, Any]:
    deployment = of_kind("Deployment")[name]
    (container,) = (c for c in containers(deployment) if c["image"] == IMAGE)
    return container


# ---- every service, and only services, deployed --------------------------------------

@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_runs_in_compose(name: str) -> None:
    services = compose_services()
    assert name in services, f"{name} is in SERVICES but not in {COMPOSE_FILE.name}"
    service = services[name]
    assert service["build"] == {"context": "..", "dockerfile": "compose/Dockerfile"}
    assert service["command"] == [name]
    assert service["restart"] == "unless-stopped"
    assert set(service["depends_on"]) >= INFRA
    env = compose_env(service)
    assert env["KOI_NATS_URL"] == "tls://nats:4222"
    assert env["KOI_REDIS_URL"] == "redis://redis:6379/0"
    # its own NATS user, and only its own user's files mounted
    assert env["KOI_NATS_USER"] == name
    assert env["KOI_NATS_PASSWORD_FILE"] == f"{SECRETS_DIR}/password"
    assert env["KOI_NATS_CA"] == f"{SECRETS_DIR}/ca.pem"
    (mount,) = [v for v in service["volumes"] if isinstance(v, dict)
                and v.get("target") == SECRETS_DIR]
    assert mount["source"] == SETUP and mount["read_only"] is True
    assert mount["volume"]["subpath"] == f"users/{name}"


def test_compose_nats_runs_the_generated_config_with_tls_and_users() -> None:
    services = compose_services()
    setup, nats = services[SETUP], services["nats"]
    assert "koi security init /koi-secrets" in " ".join(setup["command"])
    assert "--san nats" in " ".join(setup["command"])
    assert nats["command"] == ["-c", "/koi-secrets/nats.conf"]
    assert nats["depends_on"][SETUP]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_deployment_in_its_own_file(name: str) -> None:
    path = K8S_DIR / f"{name}.yaml"
    assert path.is_file(), f"{name} is in SERVICES but {path.relative_to(REPO)} is missing"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"] == [name]
    container = koi_container(name)
    assert container["args"] == [name]  # the image's ENTRYPOINT is `koi serve`
    assert {"configMapRef": {"name": CONFIG_MAP}} in container["envFrom"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), (name, kind)


def test_nothing_runs_koi_under_an_unknown_name() -> None:
    for key, service in compose_services().items():
        if key in INFRA or key == SETUP:
            continue
        assert runs_koi(service), f"compose service {key} is neither infra nor Koi"
        assert service["command"][0] in SERVICES, (key, service["command"])
        assert service["command"] == [key]
    for name, deployment in of_kind("Deployment").items():
        assert name in SERVICES, f"Deployment {name} is not a service in SERVICES"
        for container in containers(deployment):
            if container["image"].startswith("koi"):
                assert container["args"][0] in SERVICES, (name, container["args"])


# ---- environment variables -----------------------------------------------------------

def test_every_koi_variable_is_declared() -> None:
    named: dict[str, set[str]] = {}
    for key, service in compose_services().items():
        named.setdefault(f"compose {key}", set()).update(compose_env(service))
    for name, deployment in of_kind("Deployment").items():
        for container in containers(deployment):
            named.setdefault(f"Deployment {name}", set()).update(k8s_env(container))
    for name, config_map in of_kind("ConfigMap").items():
        named.setdefault(f"ConfigMap {name}", set()).update(config_map.get("data", {}))
    # Anything else that names a variable: comments, ${...} defaults, the README.
    for path in (COMPOSE_FILE, DOCKERFILE, README, *K8S_DIR.glob("*.yaml")):
        named.setdefault(str(path.relative_to(REPO)), set()).update(
            KOI_VAR.findall(path.read_text()))
    undeclared = {where: sorted(v for v in names if v.startswith("KOI_") and v not in ENV)
                  for where, names in named.items()}
    undeclared = {where: names for where, names in undeclared.items() if names}
    assert not undeclared, f"not declared in services/runtime/settings.py ENV: {undeclared}"


def test_compose_defaults_are_the_declared_defaults() -> None:
    for name, default in re.findall(r"\$\{(KOI_[A-Z0-9_]+):-([^}]*)\}", COMPOSE_FILE.read_text()):
        assert default == ENV[name][0], f"{name}: compose says {default!r}, ENV {ENV[name][0]!r}"


def test_configmap_points_at_external_nats_and_redis() -> None:
    data = of_kind("ConfigMap")[CONFIG_MAP]["data"]
    assert data["KOI_NATS_URL"].startswith("tls://")
    assert data["KOI_NATS_PASSWORD_FILE"] == f"{SECRETS_DIR}/password"
    assert data["KOI_NATS_CA"] == f"{SECRETS_DIR}/ca.pem"
    assert data["KOI_REDIS_URL"].startswith("redis://")
    for url in (data["KOI_NATS_URL"], data["KOI_REDIS_URL"]):
        assert "127.0.0.1" not in url and "localhost" not in url, url


# ---- image ---------------------------------------------------------------------------

def test_dockerfile_entrypoint_is_koi_serve() -> None:
    text = DOCKERFILE.read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.MULTILINE)
    assert json.loads(entrypoint) == ["koi", "serve"]
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    # Protos are generated into libs/ before the (non-editable) install copies libs/.
    assert text.index("scripts/gen_protos.py") < text.index("pip install --no-deps .")


def test_dockerfile_copies_paths_that_exist() -> None:
    for line in re.findall(r"^COPY\s+(.+)$", DOCKERFILE.read_text(), re.MULTILINE):
        *sources, _dest = line.split()
        for source in sources:
            assert (REPO / source).exists(), f"Dockerfile copies {source}, which is not in the repo"


def test_installed_package_ships_the_data_files_services_read() -> None:
    """The image installs Koi non-editable: data files outside package-data are lost."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["koi"]
    root = REPO / "libs" / "koi"
    data = [p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "data" in p.relative_to(root).parts[:-1]
            and "__pycache__" not in p.parts]
    missing = [d for d in data if not any(fnmatch.fnmatch(d, g) for g in globs)]
    assert not missing, f"add to [tool.setuptools.package-data] koi in pyproject.toml: {missing}"


# ---- scale, ports, probes ------------------------------------------------------------

def test_scaled_out_services_have_replicas() -> None:
    services, deployments = compose_services(), of_kind("Deployment")
    for name, least in SCALED_OUT.items():
        assert services[name]["deploy"]["replicas"] >= least, name
    for name, least in K8S_SCALED_OUT.items():
        assert deployments[name]["spec"]["replicas"] >= least, name
    # The simulated cluster is one world: optional in compose, never scaled.
    assert services["sim"].get("profiles"), "sim should be an optional (profiled) service"
    assert deployments["sim"]["spec"]["replicas"] == 1


def published_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).rpartition(":")[2].partition("/")[0]))
    return ports


def test_planner_api_serves_grpc_on_the_declared_port() -> None:
    api = compose_services()["planner-api"]
    assert GRPC_PORT in published_ports(api)
    assert compose_env(api)["KOI_GRPC_ADDR"] == f"0.0.0.0:{GRPC_PORT}"

    deployment = of_kind("Deployment")["planner-api"]
    container = koi_container("planner-api")
    assert k8s_env(container)["KOI_GRPC_ADDR"] == f"0.0.0.0:{GRPC_PORT}"
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert GRPC_PORT in named_ports.values()

    service = of_kind("Service")["planner-api"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["port"] == GRPC_PORT
    assert named_ports.get(port["targetPort"], port["targetPort"]) == GRPC_PORT
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def port_of(addr: str) -> int:
    return int(addr.rpartition(":")[2])


def test_compose_planner_api_runs_tls_and_a_token_from_koi_secrets() -> None:
    services = compose_services()
    api, setup = services["planner-api"], " ".join(services[SETUP]["command"])
    assert "--san planner-api" in setup
    env = compose_env(api)
    mounts = {v["target"]: v for v in api["volumes"] if isinstance(v, dict)}
    for name in GRPC_FILES:
        directory = env[name].rpartition("/")[0]
        mount = mounts[directory]  # each file comes from a read-only koi-secrets mount
        assert mount["source"] == SETUP and mount["read_only"] is True, name
        assert f"/koi-secrets/{mount['volume']['subpath']}" in setup  # chowned for it
    assert "KOI_GRPC_TOKEN" not in env  # by file only, never a value in the repo


def test_compose_health_check_uses_the_plaintext_health_port() -> None:
    api = compose_services()["planner-api"]
    health_addr = compose_env(api)["KOI_GRPC_HEALTH_ADDR"]
    assert health_addr == f"127.0.0.1:{GRPC_HEALTH_PORT}"  # inside the container only
    assert GRPC_HEALTH_PORT not in published_ports(api)
    check = " ".join(api["healthcheck"]["test"])
    assert f"insecure_channel('{health_addr}')" in check


def test_k8s_planner_api_runs_tls_and_a_token_from_secrets() -> None:
    container = koi_container("planner-api")
    env = k8s_env(container)
    volumes = {v["name"]: v for v in of_kind("Deployment")["planner-api"]["spec"][
        "template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    secrets = {}
    for name in GRPC_FILES:
        directory, _, key = env[name].rpartition("/")
        assert mounts[directory]["readOnly"] is True, name
        secrets[name] = (volumes[mounts[directory]["name"]]["secret"]["secretName"], key)
    assert secrets == {"KOI_GRPC_TLS_CERT": ("koi-grpc-tls", "tls.crt"),
                       "KOI_GRPC_TLS_KEY": ("koi-grpc-tls", "tls.key"),
                       "KOI_GRPC_TOKEN_FILE": ("koi-grpc-token", "token")}
    assert "KOI_GRPC_TOKEN" not in env


def test_k8s_probes_check_the_plaintext_health_port() -> None:
    container = koi_container("planner-api")
    health_addr = k8s_env(container)["KOI_GRPC_HEALTH_ADDR"]
    assert health_addr == f"0.0.0.0:{GRPC_HEALTH_PORT}"  # the kubelet dials the pod's IP
    named_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named_ports["health"] == port_of(health_addr) != GRPC_PORT
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # a grpc probe takes a number, not a port name
        assert container[probe]["grpc"]["port"] == port_of(health_addr), probe
    (service_port,) = of_kind("Service")["planner-api"]["spec"]["ports"]
    assert service_port["port"] == GRPC_PORT  # the health port is not exposed


# ---- Kubernetes hygiene --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_deployment_has_its_own_nats_user_from_a_secret(name: str) -> None:
    container = koi_container(name)
    assert k8s_env(container)["KOI_NATS_USER"] == name
    assert "KOI_NATS_PASSWORD" not in k8s_env(container)  # never a value in the repo
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SECRETS_DIR]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in of_kind("Deployment")[name]["spec"]["template"]["spec"][
        "volumes"]}
    assert volumes[mount["name"]]["secret"]["secretName"] == f"koi-nats-{name}"


def test_no_secret_values_in_the_repo() -> None:
    assert "Secret" not in {doc["kind"] for _, doc in k8s_docs()}
    for path in (COMPOSE_FILE, *K8S_DIR.glob("*.yaml")):
        for name in ("KOI_NATS_PASSWORD", "KOI_GRPC_TOKEN"):
            assert f"{name}:" not in path.read_text(), (path.name, name)


def test_no_statefulsets_nats_and_redis_are_external() -> None:
    kinds = {doc["kind"] for _, doc in k8s_docs()}
    assert "StatefulSet" not in kinds


def test_deployment_selectors_match_template_labels() -> None:
    for name, deployment in of_kind("Deployment").items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector and selector.items() <= labels.items(), name


def test_everything_lives_in_the_koi_namespace() -> None:
    assert NAMESPACE in of_kind("Namespace")
    config_maps = of_kind("ConfigMap")
    for path, doc in k8s_docs():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, (path.name, doc["kind"])
        if doc["kind"] == "Deployment":
            for container in containers(doc):
                for source in container.get("envFrom", []):
                    assert source["configMapRef"]["name"] in config_maps, path.name


def test_readme_describes_every_service() -> None:
    text = README.read_text()
    for name in SERVICES:
        assert f"`{name}`" in text, f"compose/README.md does not mention `{name}`"
