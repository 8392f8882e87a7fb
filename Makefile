# Two commands a fresh machine needs (Python >= 3.11 and Java 17): `make demo` and `make test`.
# Both create .venv and install the project with everything it needs from the package registry.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit slow bench clean nftables

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

test: lint types
	$(PY) -m pytest -m "not slow"

slow: $(STAMP)
	$(PY) -m pytest -m "slow"

# The real-path benchmark (benchmarks/bench_realpath.py) drops packets with nftables. As root
# on a fresh Debian machine (CI) this installs it from Debian's packages; without root the
# benchmark says what it needs and exits non-zero.
nftables:
	@command -v nft >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || \
		apt-get install -y -q nftables || { apt-get update -q && apt-get install -y -q nftables; }

bench: $(STAMP) nftables
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
