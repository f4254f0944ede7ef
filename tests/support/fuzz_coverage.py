"""Coverage-guided fuzzing of every bus decoder and the YAML loaders (atheris, libFuzzer).

Hypothesis (tests/property/test_fuzz_decoders.py) draws examples at random from strategies;
libFuzzer instead keeps any input that reaches a branch of ``koi`` it has not reached
before and mutates that, so it digs into the decoders' validation paths. One target takes
every decoder: the first byte picks it (``TARGETS``), the rest is its input. The property
is the Hypothesis module's, from the same table (``DECODERS``, ``check_decoder``): return,
or raise the documented "invalid input" error with a one-line bounded message. Anything
else is a crash: libFuzzer prints the Python traceback, writes the input to
``-artifact_prefix`` and exits non-zero.

Run (``make fuzz`` does, for longer)::

    .venv/bin/python -m tests.support.fuzz_coverage CORPUS_DIR -max_total_time=60 \\
        -artifact_prefix=DIR/

The corpus directory is filled with each decoder's seed messages and the shipped YAML
files before the run, so mutation starts from valid input.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "property"))

with atheris.instrument_imports(include=["koi"]):
    import test_fuzz_decoders as F

YAML_FILE = Path(tempfile.mkdtemp(prefix="koi-fuzz-")) / "fuzzed.yaml"


def _yaml(load: Callable[[Path], Any]) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        YAML_FILE.write_bytes(data)
        F.check_loader(load, YAML_FILE)
    return run


# (name, run on the input after the selector byte, seed inputs)
TARGETS: list[tuple[str, Callable[[bytes], None], list[bytes]]] = [
    (name, lambda data, d=decode: F.check_decoder(d, data),
     [F.codec.encode(s) for s in seeds])
    for name, (_, decode, seeds) in sorted(F.DECODERS.items())
]
TARGETS += [
    ("job yaml", _yaml(lambda p: F.load_jobs_yaml(p, catalog=F.CATALOG)),
     [(F.REPO / "examples/jobs" / n).read_bytes()
      for n in ("chat-online.yaml", "batch-summarize.yaml")]),
    ("scenario yaml", _yaml(lambda p: F.load_scenario(p, catalog=F.CATALOG)),
     [F.scenario_path("hetero-3h").read_bytes()]),
]


def one_input(data: bytes) -> None:
    if not data:
        return
    name, run, _ = TARGETS[data[0] % len(TARGETS)]
    try:
        run(data[1:])
    except BaseException as e:
        e.add_note(f"coverage fuzz target: {name!r}")
        raise


def write_corpus(directory: Path) -> int:
    """Every target's seeds, prefixed with its selector byte; returns how many."""
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    for i, (_, _, seeds) in enumerate(TARGETS):
        for j, seed in enumerate(seeds):
            (directory / f"seed-{i:02d}-{j}").write_bytes(bytes([i]) + seed)
            n += 1
    return n


def main(argv: list[str]) -> None:
    corpus = next((a for a in argv[1:] if not a.startswith("-")), None)
    if corpus is not None:
        write_corpus(Path(corpus))
    print(f"coverage fuzz: {len(TARGETS)} targets", file=sys.stderr, flush=True)
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("KOI_LOG_LEVEL", "warning")
    main(sys.argv)
