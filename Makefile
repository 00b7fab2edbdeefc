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
# - test-clusters: the tests that use a shared Ray cluster (marker `cluster`, set
#   by tests/conftest.py), one cluster at a time, the local fleet's first;
# - test-rest: the tests that need no cluster, in TEST_WORKERS worker processes
#   (pytest-xdist, a file at a time), then those that start a cluster of their
#   own (`own_cluster`), one at a time, by when the shared ones are mostly done.
# Most tests wait (on Ray, a server, a database) more than they compute, so the
# two side by side on 2 cores finish sooner than one after the other; two 5-node
# clusters at once for long do not. Each prints its own summary (--output-sync);
# make fails if either does, and test-rest runs its second part either way.
# The browser tests (tests/test_ui_browser.py) drive Debian's chromium.
TEST_WORKERS ?= 2
test: $(STAMP)
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	$(MAKE) --no-print-directory -j2 --output-sync=target test-clusters test-rest

test-clusters: $(STAMP)
	$(BIN)/python -m pytest -m "cluster and not own_cluster" $(PYTEST_ARGS)

test-rest: $(STAMP)
	$(BIN)/python -m pytest -m "not cluster" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS); rest=$$?; \
	$(BIN)/python -m pytest -m own_cluster $(PYTEST_ARGS); own=$$?; \
	test $$rest -eq 0 -o $$rest -eq 5 && test $$own -eq 0 -o $$own -eq 5  # 5: PYTEST_ARGS selected none here

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
