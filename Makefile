# Koi: two commands do everything on a fresh machine: `make demo` and `make test`.
# Only CPython 3.11+ is assumed; every other dependency is pinned in requirements.lock.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | cksum | cut -d' ' -f1)
GEN_STAMP := libs/koi/v1/.generated

.PHONY: venv proto test demo lint bench typecheck clean

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

test: proto
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: proto
	$(BIN)/koi demo $(DEMO_ARGS)

bench: proto
	$(BIN)/koi bench predictor

lint: proto
	$(BIN)/ruff check .
	cd proto && ../$(BIN)/buf lint

typecheck: proto
	$(BIN)/mypy libs/koi

clean:
	rm -rf $(VENV) libs/koi/v1 .pytest_cache
