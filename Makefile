# Two commands a fresh machine needs (Python >= 3.11 and Java 17): `make demo` and `make test`.
# Both create .venv and install the project with everything it needs from the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit slow bench clean debs ts

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (found %s); set PYTHON=/path/to/python3.11" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,service]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m aqueduct_spark.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(STAMP)
	$(VENV)/bin/mypy

# Python caches compiled modules (__pycache__) even where the shell says not to
# (PYTHONDONTWRITEBYTECODE): the tests start hundreds of Python processes (services, CLI
# runs, Spark's Python workers), and each would compile the project's modules again (about
# 0.25 s of CPU for a service's imports), the test modules once more at collection (6 s).
TESTENV := PYTHONDONTWRITEBYTECODE=

# Two pytest-xdist workers: the suite mostly waits (for services, Spark's Python workers and
# other processes to start), so two workers on two cores take about half the time of one.
# --dist loadscope, with the scopes of tests/conftest.py: a module runs whole on one worker
# (its fixtures start once), and all of tests/spark on one (one Spark session, not two).
# To run a few tests, plain `pytest tests/...` is faster (no workers to start).
XDIST := -n 2 --dist loadscope

test: lint types debs ts
	$(TESTENV) $(PY) -m pytest -m "not slow" $(XDIST)

slow: $(STAMP) debs ts
	$(TESTENV) $(PY) -m pytest -m "slow"

# Debian packages whose programs the tests and benchmarks call: one list, installed by
# `make test` (and `make bench`). nftables: `nft` drops packets and ICMP in the real-path tests
# (tests/core/test_realpath.py) and benchmark. A test that starts calling another Debian
# program (chromium, chromedriver, ...) adds its package here (tests/test_packaging.py checks).
# chromium: the browser tests (tests/browser, clients/typescript) drive Debian's headless
# Chromium through Playwright.
DEBS := nftables chromium chromium-driver

# As root where apt-get exists (CI, a fresh machine): installs what is missing, and says
# nothing when everything is there. Otherwise it names what is missing and how to install it,
# and the tests go on (those that need a missing program fail or skip saying so).
debs:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null | grep -qx installed || echo $$p; done); \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing the Debian packages the tests call:" $$missing; \
		export DEBIAN_FRONTEND=noninteractive; log=$$(mktemp); \
		{ apt-get install -y -qq $(DEBS) || { apt-get update -qq && apt-get install -y -qq $(DEBS); }; } >$$log 2>&1 || \
		{ cat $$log >&2; echo "make: apt-get could not install" $$missing >&2; rm -f $$log; exit 1; }; \
		rm -f $$log; \
	else \
		echo "make: the tests call programs from Debian packages not installed here:" $$missing"." \
			"Install them as root (apt-get install" $$missing"), or run make as root." \
			"Tests that need them fail or skip." >&2; \
	fi

# The TypeScript client and the console (clients/typescript, docs/browser.md): npm installs
# exactly the lock file (no browser download: playwright-core drives Debian's chromium, in
# DEBS), and vite builds the console and the browser tests' harness page into dist/. Built
# here, not committed: the test path needs npm for playwright-core anyway, and a committed
# bundle (300 KB of minified apache-arrow) would go stale unnoticed. tests/typescript runs
# the type check, the unit tests (vitest) and the browser tests under pytest.
TS := clients/typescript
TS_INSTALLED := $(TS)/node_modules/.installed
TS_BUILT := $(TS)/dist/.built
TS_SOURCES := $(shell find $(TS)/src $(TS)/console $(TS)/browser -type f 2>/dev/null) $(TS)/vite.config.ts

$(TS_INSTALLED): $(TS)/package.json $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(TS_BUILT): $(TS_INSTALLED) $(TS_SOURCES)
	cd $(TS) && npm run --silent build
	touch $@

ts: $(TS_BUILT)

bench: $(STAMP) debs ts
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis $(TS)/node_modules $(TS)/dist
