# The two Quick start commands. Each creates .venv on first use; both work on a fresh machine
# with Python 3.11 and pip.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test check lint bench clean

AZURITE := 3.37.0

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# Azurite, the Azure Storage emulator the tests start on 127.0.0.1: npm, from Debian if
	# missing; where neither is to be had, the Azure tests skip and say why
	command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm) \
		>/dev/null 2>&1 || true
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund \
		--prefix $(VENV)/azurite azurite@$(AZURITE); fi
	touch $(STAMP)

## make run: set up, create the sample data if missing, and pack it (etl run pipeline.yaml)
run: $(STAMP)
	test -d data/sample || $(BIN)/etl sample-data data/sample
	$(BIN)/etl run pipeline.yaml

# Debian's Chromium, for the report's browser tests, where this machine can install it (root
# and apt-get); elsewhere those tests skip and say what to install
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	-(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
		>/dev/null 2>&1

## make test: set up, lint, type-check, and run the whole test suite
test: $(STAMP) lint $(CHROMIUM)
	$(BIN)/python -m pytest -n 2 --dist loadfile

## make check: the fast tier while working (under 3 minutes on 2 cores): lint, type-check and
## every test not marked slow (end to end, fuzzing, trainers: docs/architecture.md, "Test tiers")
check: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow and not cuda" -q -rf

lint: $(STAMP)
	$(BIN)/ruff check etl loaders tests
	$(BIN)/ruff format --check etl loaders tests
	$(BIN)/mypy

## make bench: the benchmarks whose results are in benchmarks/README.md
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf $(VENV) artifacts .pytest_cache .mypy_cache .ruff_cache
