# turnmesh: `make run` starts the mesh, `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Programs the tests use that come from Debian, not PyPI: command:package.
SYSTEM_COMMANDS := curl:curl node:nodejs npm:npm redis-server:redis-server wrk:wrk tesseract:tesseract-ocr ip:iproute2 chromium:chromium chromedriver:chromium-driver
# The real AG-UI client, pinned by package-lock.json, for the AG-UI tests.
NODE_STAMP := clients/agui/node_modules/.package-lock.json

.PHONY: install system-deps gen test test-unit test-multihost lint format run bench chaos clean

install: system-deps $(STAMP) $(NODE_STAMP)

# Idempotent and quiet: apt-get runs only when something is missing (CI is root).
system-deps:
	@missing=""; for pair in $(SYSTEM_COMMANDS); do \
	  command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing from Debian"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "please install:$$missing"; exit 1; fi; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

$(NODE_STAMP): clients/agui/package.json clients/agui/package-lock.json
	@npm ci --prefix clients/agui --no-audit --no-fund --silent

gen: install
	$(PY) scripts/gen_protos.py
	$(PY) scripts/gen_api_docs.py

test: install
	$(PY) -m pytest

test-unit: install
	$(PY) -m pytest tests/unit

# Six hosts in network namespaces (root): also part of `make test`.
test-multihost: install
	$(PY) -m pytest -s tests/integration/test_multihost.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

run: install
	$(VENV)/bin/turnmesh up

bench: install
	$(PY) -m bench.suite
	$(PY) -m bench.store_append

# 64 conversations for 90 s while workers, a server and the router are killed;
# writes chaos-report.json and fails if a turn was lost or duplicated.
chaos: install
	$(PY) -m tests.support.chaos --seconds 90 --conversations 64 --report chaos-report.json

clean:
	rm -rf $(VENV) build *.egg-info
