# Two entry points: `make serve` (set up, pull the default models, run the service) and
# `make test` (set up, pull the test model, run the suite). Everything else is a step of those.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup sandbox models serve complete test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP) sandbox

# The code_tests verifier runs model-written code in bubblewrap; `config check` and `serve` refuse
# a config that needs it when it is missing.
sandbox:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q bubblewrap \
	    || echo "could not install bubblewrap; code_tests stays refused until it is" >&2; \
	  else echo "bubblewrap is missing: run 'sudo apt-get install bubblewrap' (needed only for the code_tests verifier)" >&2; fi; }

models: setup
	$(BIN)/tierroute models pull qwen2.5-coder-0.5b-instruct-q4_k_m
	$(BIN)/tierroute models pull qwen2.5-coder-1.5b-instruct-q4_k_m

serve: models
	$(BIN)/tierroute serve

complete: models
	$(BIN)/tierroute complete "What is 17 * 3?"

test: setup
	$(BIN)/tierroute models pull smollm2-135m-instruct-q4_1
	$(BIN)/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) *.egg-info
