# The front door: `make serve` and `make test` on a fresh machine; CI runs `.ci/run` (check + test).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: serve test check bench install proto clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned to the CPU build (2.13.0); any other version pulls a multi-GB CUDA build.
# /opt/wheels (where this machine keeps the CPU torch wheel) is searched when it exists.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

$(STAMP): pyproject.toml $(BIN)/python
	$(BIN)/pip install --quiet $(FIND_LINKS) -e '.[dev,llm]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/tensorgate serve $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n auto -q

check: $(STAMP)
	$(BIN)/ruff format --check tensorgate tests benchmarks
	$(BIN)/ruff check tensorgate tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# Regenerate the committed gRPC stubs (a test checks that this changes nothing).
proto: $(STAMP)
	$(BIN)/python -m tensorgate.protocols.grpc.generate

clean:
	rm -rf $(VENV) build dist *.egg-info
