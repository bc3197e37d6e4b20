# The README's commands: `make demo`, `make check` and `make test`. Each sets up what
# it needs first (system packages when root, .venv/ otherwise reused), sized to the
# command: scripts/bootstrap.sh demo|check|servers|all.
VENV := .venv
PY := $(VENV)/bin/python

# The fast lane, chosen by marker over all of tests/ (no hand-kept file list): no
# server (integration, slow_server: tests/conftest.py marks every test using a server
# fixture) and no pytest session of its own (plugin_session: every pytester test).
FAST := not integration and not slow_server and not plugin_session

.PHONY: setup setup-demo setup-check setup-upgrade servers demo upgrade-demo upgrade-inplace check lint test bench clean history-demo

# everything make test runs (what the install hints of the embedded servers name)
setup:
	@bash scripts/bootstrap.sh all

setup-demo:
	@bash scripts/bootstrap.sh demo

setup-check:
	@bash scripts/bootstrap.sh check

setup-upgrade:
	@bash scripts/bootstrap.sh upgrade

# the embedded server farm and the report tools, without the Python environment
servers:
	@bash scripts/bootstrap.sh servers

demo: setup-demo
	$(PY) -m pytest suites/xrootd -p no:cacheprovider -rs \
		--storage-results storagescale-results/demo.json

# The upgrade gate (docs/upgrade.md): suites/xrootd against the embedded xrootd 5.5.3,
# then against 6.2.1 (built into ~/.cache once: 15-30 min the first time) with the
# first run as its baseline, then both side by side. Exit status: the second run's, else
# storagescale compare's (1 when it lists a regression or behaviour change, 4 bad input).
# The plans (thresholds/xrootd/5.x.toml, 6.x.toml) are the short demo ones already (5 s
# steps); UPGRADE_SCALE=0.05 is quicker, with 1 s steps that vary more between runs.
UPGRADE_SCALE ?= 1
UPGRADE := storagescale-results/upgrade
upgrade-demo: setup-upgrade
	$(PY) -m pytest suites/xrootd -p no:cacheprovider -q -rs --storage-scale $(UPGRADE_SCALE) \
		--storage-results $(UPGRADE)/before.json
	@status=0; $(PY) -m pytest suites/xrootd -p no:cacheprovider -q -rs \
		--storage-scale $(UPGRADE_SCALE) --storage-embedded-version 6.2.1 \
		--storage-baseline $(UPGRADE)/before.json --storage-results $(UPGRADE)/after.json \
		|| status=$$?; \
	compared=0; $(VENV)/bin/storagescale compare $(UPGRADE)/before.json \
		$(UPGRADE)/after.json --html $(UPGRADE) || compared=$$?; \
	echo "upgrade gate: the 6.2.1 run's pytest exit status was $$status, storagescale" \
		"compare's $$compared"; [ $$status -ne 0 ] && exit $$status; exit $$compared

# The upgrades in place (docs/upgrade.md): XRootD 5.5.3 -> 6.2.1 on one data directory
# and dCache 10.2.25 -> 11.2.5 on one database and set of pools, a seeded tree written
# through the old release's doors and verified through the new one's; prints each
# verdict and the measured times. SERVER=xrootd or dcache for one; CORRUPT=1 flips a
# byte of one stored file between the two (the verify must name it corrupted). The
# server's suite runs on the old release after the tree is written and on the new one
# after the verify, judged against the first run (--storage-baseline): its exit status
# is the verdict. INPLACE_ARGS: pytest arguments of both runs; SUITE=0 files only.
SERVER ?= all
INPLACE_ARGS ?= --storage-scale 0.05
upgrade-inplace: setup
	$(PY) scripts/upgrade_inplace.py --server $(SERVER) $(if $(CORRUPT),--corrupt,) \
		$(if $(filter 0,$(SUITE)),--no-suite,) --pytest-args "$(INPLACE_ARGS)"

# The history of runs end to end (docs/history.md, issue 37): eight runs of the xrootd
# stat scan (three on the embedded 5.5.3, three on 6.2.1, one on 6.2.1 with its CPU
# capped at 5 % of a core by a cgroup: the deliberately slowed run, one more on 6.2.1)
# into one SQLite history and a real Pushgateway and Prometheus on loopback; then
# storagescale history must name the slowed run, Prometheus answer the last run's stat
# rate per version, and each Grafana panel's query return series. Needs root (the
# cgroup); ~9 min. Its folder: storagescale-results/history-demo/. HISTORY_DCACHE=1 adds
# a run of suites/dcache's ls scan on each cached embedded dCache release (minutes each).
history-demo: setup
	$(PY) scripts/history_demo.py $(if $(HISTORY_DCACHE),--dcache,)

# ruff, mypy on the package, the import contracts (pyproject.toml [tool.importlinter])
lint:
	$(PY) -m ruff check pytest_storagescale tests suites benchmarks conftest.py
	$(PY) -m mypy pytest_storagescale
	$(VENV)/bin/lint-imports --no-cache

check: setup-check lint
	$(PY) -m pytest tests -p no:cacheprovider -q -n 2 -m "$(FAST)"

# --dist loadgroup: the tests of one xdist_group run on one worker (tests/conftest.py
# puts every test of the shared embedded_dcache in one, so the run starts it once); the
# groups go first, then the modules holding a long_running test (tests/conftest.py
# collects them first), so that short tests, not a 2-minute suite run, end the run
test: setup
	$(MAKE) lint
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
	$(PY) -m pytest tests -p no:cacheprovider -n 2 --dist loadgroup -rs --durations=30

# BENCH=--quick for a first try (fewer points); the results go into docs/benchmarks.md
bench: setup
	$(PY) benchmarks/bench_engine.py --write-docs $(BENCH)
	$(PY) benchmarks/bench_open_loop.py --write-docs $(BENCH)
	@if [ -f benchmarks/bench_http.py ]; then $(PY) benchmarks/bench_http.py $(BENCH); fi

clean:
	rm -rf $(VENV) storagescale-results .pytest_cache .mypy_cache .import_linter_cache
