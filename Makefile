# The front door: `make serve` and `make test` on a fresh machine; CI runs `.ci/run` (check, then test
# on the compiled build and again on the pure-Python one).
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

# A build stamp takes the time the build started (touched before, moved into place after): a source
# edited while it builds is newer than the stamp, so the next make builds again.
$(STAMP): pyproject.toml setup.py $(BIN)/python
	rm -f $(VENV)/.compiled $(VENV)/.compiled-pure
	touch $(NATIVE).started
	$(BIN)/pip install --quiet $(FIND_LINKS) -e '.[dev,llm]'
	mv $(NATIVE).started $(NATIVE)
	touch $(STAMP)

# The modules setup.py compiles with mypyc (listed there): an edit to one rebuilds them, so nothing
# runs or is tested against a compiled copy of an older source. TENSORGATE_PURE_PYTHON=1 builds
# them uncompiled (to profile them); each way has its own stamp, so switching rebuilds.
COMPILED := $(shell TENSORGATE_LIST_COMPILED=1 $(PYTHON) setup.py)
NATIVE := $(VENV)/.compiled$(if $(TENSORGATE_PURE_PYTHON),-pure,)

$(NATIVE): $(COMPILED) | $(STAMP)
	rm -f $(VENV)/.compiled $(VENV)/.compiled-pure
	touch $(NATIVE).started
	$(BIN)/pip install --quiet --no-deps $(FIND_LINKS) -e .
	mv $(NATIVE).started $(NATIVE)

install: $(STAMP) $(NATIVE)

serve: install
	$(BIN)/tensorgate serve $(ARGS)

# The Debian programs some tests drive (nginx, Chromium, kubectl), installed first where missing.
test: install
	bash tests/system_packages.sh
	$(BIN)/python -m pytest -n auto -q

check: $(STAMP)
	$(BIN)/ruff format --check setup.py tensorgate tests benchmarks
	$(BIN)/ruff check setup.py tensorgate tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python benchmarks/run_all.py

# Regenerate the committed gRPC stubs (a test checks that this changes nothing).
proto: install
	$(BIN)/python -m tensorgate.protocols.grpc.generate

clean:
	rm -rf $(VENV) build dist *.egg-info *.so tensorgate/_build.json
	find tensorgate -name '*.so' -delete
