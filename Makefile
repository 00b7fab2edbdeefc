# Two commands matter: `make run` and `make test`. Both set up what is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-clusters test-rest test-fast setup bench clean lock

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[server,dev]"
	touch $(STAMP)

setup: $(STAMP)

# Starts the local multi-node Ray cluster (simulated GPU, spot and on-demand
# groups) if none is configured, then the API with its dispatcher loops. Its
# admin token is printed at the first start and kept in .raylane/admin_token;
# jobs may ship local directories under this one (docs/auth.md).
RAYLANE_POLICY_WORKING_DIR_ROOTS ?= ["$(CURDIR)"]
run: export RAYLANE_POLICY_WORKING_DIR_ROOTS := $(RAYLANE_POLICY_WORKING_DIR_ROOTS)
run: $(STAMP)
	$(BIN)/raylane-server serve --local-cluster

# The whole suite in two processes side by side (docs/testing.md):
# - test-clusters: the tests that use a Ray cluster, one cluster at a time: those
#   on a shared cluster (marker `cluster`, set by tests/conftest.py; the local
#   fleet's first), then those that start their own (`own_cluster`: a local
#   cluster up and down, a head killed, `serve --local-cluster`). The critical path.
# - test-rest: the tests that need no cluster, in TEST_WORKERS worker processes
#   (pytest-xdist, a file at a time), at a lower CPU priority (nice): on 2 cores
#   they take the CPU the cluster tests leave idle while those wait on Ray, and
#   slow the critical path no more than that. Side by side at equal priority the
#   two took as long as one after the other (32 min against 19 + 6 + 4.5).
# Each prints its own summary (--output-sync); make fails if either does, and
# test-clusters runs its second part either way.
# The browser tests (tests/test_ui_browser.py) drive Debian's chromium.
TEST_WORKERS ?= 2
REST_NICE ?= 10
test: $(STAMP)
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	$(MAKE) --no-print-directory -j2 --output-sync=target test-clusters test-rest

test-clusters: $(STAMP)
	$(BIN)/python -m pytest -m "cluster and not own_cluster" $(PYTEST_ARGS); shared=$$?; \
	$(BIN)/python -m pytest -m own_cluster $(PYTEST_ARGS); own=$$?; \
	test $$shared -eq 0 -o $$shared -eq 5 && test $$own -eq 0 -o $$own -eq 5  # 5: PYTEST_ARGS selected none here

test-rest: $(STAMP)
	nice -n $(REST_NICE) $(BIN)/python -m pytest -m "not cluster" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: no Ray cluster, no server or CLI subprocess, no browser
# (the `process` marker is set from what a test calls; tests/conftest.py).
test-fast: $(STAMP)
	RAYLANE_TEST_TIER=fast $(BIN)/python -m pytest -n 2 --dist loadfile -m "not ray and not slow and not process" \
		$(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/submit_throughput.py

# Re-pin after changing dependencies in pyproject.toml.
lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf $(VENV) .raylane
