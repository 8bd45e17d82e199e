# The front door: `make serve` and `make test` on a fresh machine; CI runs `.ci/run` (check, then test
# on the compiled build and again on the pure-Python one, then the wheels and the container image).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: serve test check bench install proto clean image image-test dist dist-test release

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
	$(BIN)/ruff format --check setup.py tensorgate tests benchmarks tools
	$(BIN)/ruff check setup.py tensorgate tests benchmarks tools
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: install
	$(BIN)/python benchmarks/run_all.py

# Regenerate the committed gRPC stubs (a test checks that this changes nothing).
proto: install
	$(BIN)/python -m tensorgate.protocols.grpc.generate

# The container image, tagged tensorgate:<pyproject's version>. deploy/docker/image.sh starts a
# Docker engine where none answers (as root on Debian: it installs docker.io and stops that engine
# when done) and builds on a local Debian base, made once with debootstrap, unless PYTHON_IMAGE
# names another (python:3.11-slim-bookworm, from Docker Hub). It prints how to build the gpu and
# cann variants, which need NVIDIA's or Huawei's libraries.
PYTHON_IMAGE ?=
image:
	PYTHON_IMAGE="$(PYTHON_IMAGE)" deploy/docker/image.sh build

# The image as its users run it (tests/delivery/): read-only and non-root, over HTTP and gRPC,
# healthy, draining on `docker stop` under load, and three of it behind the shipped nginx file.
image-test: install image
	deploy/docker/image.sh run $(BIN)/python -m pytest -p no:cacheprovider -q -rP \
	  tests/delivery/test_image.py tests/delivery/test_image_replicas.py

# The sdist and its wheels into dist/ (tools/dist.sh: a compiled wheel where a C compiler is, and a
# pure one that installs anywhere); dist-test installs them into fresh virtual environments with no
# C compiler and serves from them, and resolves each extra.
dist: $(STAMP)
	rm -rf dist
	tools/dist.sh dist $(BIN)/python

dist-test: install dist
	TENSORGATE_DIST=dist $(BIN)/python -m pytest -p no:cacheprovider -q -rP tests/delivery/test_wheel.py

# `make release VERSION=x.y.z`: the version everywhere it is written, and CHANGELOG.md's Unreleased
# section dated as that release (tools/release.py).
release: $(STAMP)
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z" >&2; exit 2; }
	$(BIN)/python tools/release.py $(VERSION)

clean:
	rm -rf $(VENV) build dist *.egg-info *.so tensorgate/_build.json
	find tensorgate -name '*.so' -delete
