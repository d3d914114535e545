# turnmesh: `make run` starts the mesh, `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install gen test test-unit lint format run bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

gen: install
	$(PY) scripts/gen_protos.py
	$(PY) scripts/gen_api_docs.py

test: install
	$(PY) -m pytest

test-unit: install
	$(PY) -m pytest tests/unit

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

run: install
	$(VENV)/bin/turnmesh up

bench: install
	$(PY) -m bench.turn_overhead

clean:
	rm -rf $(VENV) build *.egg-info
