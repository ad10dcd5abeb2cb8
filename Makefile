# The two commands of the README. Both create .venv and install everything on a fresh machine; `make test` also sets
# the machine up (.ci/setup-machine.sh).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

HARNESSES := .harnesses/.installed
# the agent harnesses molt/harness-*-v1 run (and their tests drive), from npm, pinned
HARNESS_PACKAGES := @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0

.PHONY: demo test lint clean harnesses machine

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/molt-train demo

$(HARNESSES): Makefile
	npm install --prefix .harnesses --no-audit --no-fund --loglevel=error $(HARNESS_PACKAGES)
	touch $(HARNESSES)

harnesses: $(HARNESSES)

test: machine lint $(HARNESSES)
	$(PY) -m pytest -q -n 2 --dist load --durations=20

# system packages and services the tests need (bubblewrap, a Docker engine, ...): .ci/setup-machine.sh
machine:
	bash .ci/setup-machine.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) runs .pytest_cache .harnesses
