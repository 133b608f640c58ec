# Two entry points: `make serve` (set up, pull the default models, run the service) and
# `make test` (set up, lint, pull the test model, build the docs strictly, run the suite). Everything
# else is a step of those, or `make check`, the fast loop while working (tests not marked slow).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama.cpp built for this CPU but without its AMX kernels: on CPUs with AMX (Sapphire Rapids and
# later) ggml's AMX matmul crashes the process mid-decode (seen with llama-cpp-python 0.3.36, in our
# engine and in llama-cpp-python's own server alike). The wheel is built once per flag set and kept.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DCMAKE_C_FLAGS='-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-march=native -mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
WHEELS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tierroute/wheels/$(shell echo "$(LLAMA_CMAKE_ARGS)" | sha256sum | cut -c1-12)

# Bytecode is written and reused: some images set PYTHONDONTWRITEBYTECODE, and then every test
# worker and every server, sandbox and upstream process a test starts compiles the project's
# modules again (and pytest rewrites every test module's asserts again in each worker). The
# suite compiles them once, in parallel, before its workers start.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup sandbox postgres browser models serve complete lint check test clean image stack-test vllm vllm-env vllm-model vllm-test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(BIN)/pip wheel -q --no-deps --no-cache-dir 'llama-cpp-python>=0.3.16' -w $(WHEELS)
	$(BIN)/pip install -q --force-reinstall --no-deps $$(ls $(WHEELS)/llama_cpp_python-*.whl | tail -n 1)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP) sandbox postgres browser

# The code_tests verifier runs model-written code in bubblewrap; `config check` and `serve` refuse
# a config that needs it when it is missing.
sandbox:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q bubblewrap \
	    || echo "could not install bubblewrap; code_tests stays refused until it is" >&2; \
	  else echo "bubblewrap is missing: run 'sudo apt-get install bubblewrap' (needed only for the code_tests verifier)" >&2; fi; }

# The PostgreSQL ledger's tests start a real server (initdb and pg_ctl in a temporary directory);
# they never skip, so the suite needs Debian's postgresql package.
PG_CTL := $(shell command -v pg_ctl || ls /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | tail -n 1)
postgres:
	@test -n "$(PG_CTL)" || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	  else echo "PostgreSQL is missing: run 'sudo apt-get install postgresql' (the ledger tests need it)" >&2; exit 1; fi; }

# The dashboard's browser tests (tests/router/dashboard/test_browser.py) drive Debian's chromium
# headless through its chromedriver with selenium; no browser is downloaded. About 50 s to install
# on this kind of machine (measured: apt-get update and install, 2 cores). Without them the
# browser tests skip and say why.
browser:
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver \
	    || echo "could not install chromium; the dashboard's browser tests skip until it is" >&2; \
	  else echo "chromium is missing: run 'sudo apt-get install chromium chromium-driver' (the dashboard's browser tests need it)" >&2; fi; }

models: setup
	$(BIN)/tierroute models pull qwen2.5-coder-0.5b-instruct-q4_k_m
	$(BIN)/tierroute models pull qwen2.5-coder-1.5b-instruct-q4_k_m

serve: models
	$(BIN)/tierroute serve

complete: models
	$(BIN)/tierroute complete "What is 17 * 3?"

# what people would otherwise review: lint, formatting, and types (strict) on the packages
lint: setup
	$(BIN)/ruff check router verifiers evals tests scripts bench
	$(BIN)/ruff format --check router verifiers evals tests scripts bench
	$(BIN)/mypy

# the fast loop: the tests not marked slow (a slow test loads a real model, starts a server,
# PostgreSQL or a sandbox, or takes seconds of CPU); one that is not marked and loads a model or
# starts a server process fails here and says so (tests/support/markers.py)
check: setup
	$(BIN)/python -m compileall -q -j 0 router verifiers evals scripts bench tests >/dev/null
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" -n $(TEST_WORKERS) --dist loadgroup

# The suite on parallel workers (pytest-xdist). --dist loadgroup keeps each slow module's tests on
# one worker (its server or model loaded once; tests/support/markers.py) and spreads the rest.
# TEST_WORKERS: measured on this 2-core machine (docs/testing.md): three keep both cores busier
# than two (a worker waiting on a server or an injected timeout leaves its core to the others).
TEST_WORKERS ?= 3

# The docs site is built strictly (mkdocs.yml): a dead link or a moved heading fails the suite.
# Never with --quiet: it hides the very warnings --strict counts, and the build passes anyway.
test: setup lint
	$(BIN)/tierroute models pull smollm2-135m-instruct-q4_1
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python -m compileall -q -j 0 router verifiers evals scripts bench tests >/dev/null
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not vllm" -n $(TEST_WORKERS) --dist loadgroup
	$(MAKE) vllm-test

# ---- vLLM as the upper tier, on the CPU (docs/vllm.md) ------------------------------------------
# Its own virtual environment outside the repository (pinned: scripts/vllm/requirements.txt), its
# checkpoint made from the pinned GGUF and hash-checked, its server on 127.0.0.1. `make vllm` serves
# in the foreground on VLLM_PORT (8000) with the key in VLLM_API_KEY. `make vllm-test` runs the
# tests against a real vLLM process (tests/scripts/vllm/), once per session: `make test`
# calls it after the suite; it adds the environment (once), the checkpoint (once) and vLLM's start.
vllm-env:
	scripts/vllm/env.sh setup

vllm-model: setup vllm-env
	scripts/vllm/env.sh model

vllm: vllm-model
	scripts/vllm/env.sh serve-only

# On a machine vLLM's CPU build cannot run on (`env.sh machine` says why) it skips, saying so,
# before downloading anything; anywhere else a failure is a failure.
vllm-test: setup
	@why="$$(scripts/vllm/env.sh machine)"; if [ -n "$$why" ]; then \
	  echo "vLLM tests skipped: vLLM cannot run on this machine: $$why" >&2; \
	else $(MAKE) --no-print-directory vllm-model \
	  && $(BIN)/tierroute models pull smollm2-135m-instruct-q4_1 \
	  && $(BIN)/python -m pytest -q -p no:cacheprovider -m vllm -n 0 tests/scripts/vllm; fi

clean:
	rm -rf $(VENV) *.egg-info site

# ---- containers (docs/container.md) -------------------------------------------------------------
# `make image` builds tierroute's image, its selftest image and the stack's PostgreSQL image with
# podman, from BASE_IMAGE, or (unset) from a Debian bookworm base that scripts/build_base_image.sh
# makes with debootstrap: no registry needed. llama.cpp gets this Makefile's flags. Podman's layer
# cache keeps llama.cpp's build across source changes. `make stack-test` runs compose.yaml and
# smoke-tests it (scripts/stack_test.sh). Build files live in TIERROUTE_BUILD_CACHE, never here.
IMAGE ?= localhost/tierroute:latest
SELFTEST_IMAGE ?= localhost/tierroute-selftest:latest
POSTGRES_IMAGE ?= localhost/tierroute-postgres:15
BASE_IMAGE ?=
DEFAULT_BASE := localhost/tierroute-base:bookworm
# Explicit ulimits: podman's defaults ask for more than this kind of machine's hard limits allow.
PODMAN_ULIMITS ?= --ulimit nofile=16384:16384 --ulimit nproc=32768:32768
# --network host: the build reaches PyPI as the host does (the build's own network had no DNS here).
# The host's CA bundle, mounted for the build's pip only (a TLS-intercepting proxy's CA lives there).
HOST_CA ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
PODMAN_BUILD = podman build --format docker --layers --network host $(PODMAN_ULIMITS) \
	$(if $(HOST_CA),-v $(HOST_CA):/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt) \
	--build-arg BASE_IMAGE=$(or $(BASE_IMAGE),$(DEFAULT_BASE))

image:
	$(if $(BASE_IMAGE),,scripts/build_base_image.sh $(DEFAULT_BASE))
	$(PODMAN_BUILD) --build-arg "LLAMA_CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)" --target runtime -t $(IMAGE) .
	$(PODMAN_BUILD) --build-arg "LLAMA_CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)" --target selftest -t $(SELFTEST_IMAGE) .
	$(PODMAN_BUILD) -t $(POSTGRES_IMAGE) deploy/postgres
	python3 scripts/seccomp_profile.py

stack-test: image
	TIERROUTE_IMAGE=$(IMAGE) TIERROUTE_SELFTEST_IMAGE=$(SELFTEST_IMAGE) TIERROUTE_POSTGRES_IMAGE=$(POSTGRES_IMAGE) \
		scripts/stack_test.sh
