# The two commands of the README: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-fast install lint check-migrations clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

install: $(STAMP)

## demo: install, migrate, seed, and run web + worker + beat + embedded Redis + simulated fleet
demo: install
	$(BIN)/python -m fleetctl.demo.devstack demo

## test: the whole suite (PostgreSQL and Redis on their standard local ports, real Chromium)
test: install check-migrations
	$(BIN)/ruff check .
	$(BIN)/python -m fleetctl.demo.devstack test $(PYTEST_ARGS)

## test-fast: what needs only PostgreSQL and Redis (no worker, fleet, gateway or browser)
test-fast: install
	$(BIN)/python -m fleetctl.demo.devstack test -m "not slow and not browser and not processes" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy fleetctl migrations_plan

check-migrations: install
	$(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
