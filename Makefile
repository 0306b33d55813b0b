# The two commands of the README. Each sets up what it needs (scripts/setup.sh is idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM = false

.PHONY: setup demo test test-slow lint bench

setup:
	@bash scripts/setup.sh $(VENV)

demo: setup
	$(VENV)/bin/hf-vrl demo

test: setup
	$(PY) -m pytest -q -n 2

test-slow: setup
	RUN_SLOW=1 $(PY) -m pytest -q -n 2 -m slow

lint: setup
	$(VENV)/bin/ruff format --check src tests benchmarks examples
	$(VENV)/bin/ruff check src tests benchmarks examples
