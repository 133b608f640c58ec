# Two entry points: `make serve` (set up, pull the default models, run the service) and
# `make test` (set up, pull the test model, run the suite). Everything else is a step of those.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup models serve complete test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(STAMP)

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
