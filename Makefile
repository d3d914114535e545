# turnmesh: `make run` starts the mesh, `make test` runs every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# Programs the tests use that come from Debian, not PyPI: command:package.
SYSTEM_COMMANDS := curl:curl node:nodejs npm:npm redis-server:redis-server redis-cli:redis-tools wrk:wrk tesseract:tesseract-ocr ip:iproute2 chromium:chromium chromedriver:chromium-driver
# PostgreSQL's server (the Postgres store's tests start one): Debian installs
# it off PATH, so it is checked by this path.
POSTGRES := /usr/lib/postgresql/15/bin/postgres
# From npm, each pinned by its package-lock.json: the real AG-UI client, the
# Vercel AI SDK and grpc-js (tests), and buf (the proto module's build, lint and breaking check).
NODE_DIRS := clients/agui clients/aisdk clients/grpc-js tools
NODE_STAMPS := $(NODE_DIRS:%=%/node_modules/.package-lock.json)
BUF := tools/node_modules/.bin/buf

.PHONY: install bytecode system-deps gen test test-unit test-multihost lint typecheck proto-lint proto-baseline format run bench chaos clean

# The package's own folders (pyproject's package-dir), with what the tests'
# processes import (tests/support, bench).
SOURCES := turnmesh gen runtime router server worker agent cli envoy files client playground tests/support bench

install: system-deps $(STAMP) $(NODE_STAMPS) bytecode

# An editable install leaves the project's modules uncompiled; where
# PYTHONDONTWRITEBYTECODE is set (this sandbox, CI) every process compiled
# them again: 0.2 s of CPU per member, and the tests start hundreds.
# Up-to-date files are skipped; an edited one is compiled again here.
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 $(SOURCES)

# Idempotent and quiet: apt-get runs only when something is missing (CI is root).
system-deps:
	@missing=""; for pair in $(SYSTEM_COMMANDS); do \
	  command -v $${pair%%:*} >/dev/null || missing="$$missing $${pair#*:}"; done; \
	test -x $(POSTGRES) || missing="$$missing postgresql"; \
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

%/node_modules/.package-lock.json: %/package.json %/package-lock.json
	@npm ci --prefix $* --no-audit --no-fund --silent

gen: install
	$(PY) scripts/gen_protos.py
	$(PY) scripts/gen_api_docs.py

# Three test processes on two cores, a file each at a time (a file's tests
# share its mesh): a third of the suite's time is tests waiting on processes
# (a lease to pass, a member to start), and a third process fills it.
test: install
	$(PY) -m pytest -n 3 --dist loadfile

test-unit: install
	$(PY) -m pytest tests/unit

# Six hosts in network namespaces (root): the mTLS mesh is also part of
# `make test`; this runs the mesh-key one as well.
test-multihost: install
	TURNMESH_MULTIHOST_ALL=1 $(PY) -m pytest -s tests/integration/test_multihost.py

lint: install typecheck proto-lint
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy --strict on every hand-written module (scripts/typecheck.py maps the
# folders onto the turnmesh package as setuptools does).
typecheck: install
	$(PY) scripts/typecheck.py

# The proto module builds offline, follows Buf's style (exceptions in buf.yaml),
# and breaks no public contract: proto/ against buf.baseline.binpb, the public
# protos as last released. A deliberate break goes in buf.yaml's
# breaking.ignore_only with the issue that needs it (docs/api.md, "Changing the protos").
proto-lint: install
	$(BUF) build
	$(BUF) lint
	$(BUF) breaking proto --against buf.baseline.binpb

# After a release: the protos as they are now become the baseline.
proto-baseline: install
	$(BUF) build proto -o buf.baseline.binpb

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

run: install
	$(VENV)/bin/turnmesh up

bench: install
	$(PY) -m bench.suite
	$(PY) -m bench.store_append
	$(PY) -m bench.refusals --refusals 270000
	$(PY) -m bench.listing
	$(PY) -m bench.loop_lag
	$(PY) -m bench.seeded_history
	$(PY) -m bench.collect_memory
	$(PY) -m bench.body_memory
	$(PY) -m bench.paced
	$(PY) -m bench.compat_cost
	$(PY) -m bench.peers
	$(PY) -m bench.floors
	$(PY) -m bench.retention
	$(PY) -m bench.webhooks
	$(PY) -m bench.a2a_push
	$(PY) -m bench.edge_uploads

# 64 conversations for 90 s while workers, a server and the router are killed
# and a server is frozen (SIGSTOP, then SIGCONT), on Redis, then on PostgreSQL;
# writes chaos-report.json (and -postgres.json) and fails if a turn was lost or
# duplicated, or a caller got an unexplained 503.
chaos: install
	$(PY) -m tests.support.chaos --seconds 90 --conversations 64 --report chaos-report.json
	$(PY) -m tests.support.chaos --seconds 90 --conversations 64 --store postgres --report chaos-report-postgres.json

clean:
	rm -rf $(VENV) build *.egg-info
