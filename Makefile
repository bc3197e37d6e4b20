# The README's two commands: `make demo` and `make test`. Both set everything up
# first (system packages when root, .venv/ otherwise reused).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	$(PY) -m pytest suites/xrootd -p no:cacheprovider -rs \
		--storage-results storagescale-results/demo.json

test: setup
	$(PY) -m ruff check pytest_storagescale tests suites benchmarks conftest.py
	$(PY) -m pytest tests -p no:cacheprovider -n 2 -rs

# BENCH=--quick for a first try (fewer points); the results go into docs/benchmarks.md
bench: setup
	$(PY) benchmarks/bench_engine.py --write-docs $(BENCH)
	@if [ -f benchmarks/bench_http.py ]; then $(PY) benchmarks/bench_http.py $(BENCH); fi

clean:
	rm -rf $(VENV) storagescale-results .pytest_cache
