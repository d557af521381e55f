# The two commands a new user runs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# The newest Python supported (tox.ini's py313 environment), shown to tox's discovery:
# python3.13 if it runs, else pyenv's 3.13 (pyenv's shim refuses a version that is not
# its global one).
PYTHON_NEWEST ?= $(shell for p in python3.13 $$HOME/.pyenv/versions/3.13*/bin/python3.13; do \
	"$$p" -c 'import sys; print(sys.executable)' 2>/dev/null && break; done)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# The test environments are tox's (tox.ini): lint (.venv-lint), tf (.venv: TensorFlow,
# Reverb, TF-Agents on NumPy 1.26) and modern (.tox/modern: NumPy 2, PyTorch, JAX). tox
# itself lives in an environment of its own, at a pinned version.
TOX_VERSION := 4.67.15
TOXENV_DIR  := .venv-tox
TOX         := $(TOXENV_DIR)/.tox-$(TOX_VERSION)
TOXRUN      := $(TOXENV_DIR)/bin/tox run -x testenv.base_python=$(PYTHON)
TOXPAR      := $(TOXENV_DIR)/bin/tox run-parallel --parallel all --parallel-no-spinner -x testenv.base_python=$(PYTHON) \
	$(if $(PYTHON_NEWEST),--discover $(PYTHON_NEWEST))

.PHONY: demo test lint tf-env bench bench-elements bench-vllm bench-sharded soak stress clean

$(TOX):
	$(PYTHON) -m venv $(TOXENV_DIR)
	$(TOXENV_DIR)/bin/python -m pip --disable-pip-version-check -q install "tox==$(TOX_VERSION)"
	touch $@

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# The demo's needs: the core and the reverb extra (TensorFlow 2.15, dm-reverb 0.14), into
# .venv directly (quicker than all of tox's tf environment; `make test` completes it).
$(VENV)/.reverb-installed: pyproject.toml | $(PY)
	$(PIP) install -e ".[reverb]"
	touch $@

# .venv as tox's tf environment has it, without running anything: for bench and soak.
tf-env: $(TOX)
	$(TOXRUN) -e tf --notest

# One learner process serving an embedded Reverb server, three actor processes.
demo: $(VENV)/.reverb-installed
	scripts/loopback-only $(PY) examples/reverb_learner_actors.py

# The lint and type gate (ruff, mypy: zero findings on varsync/, plugins/, benchmarks/ and
# tools/), then the suite in both worlds, in tox's environments (tox.ini says what each
# holds and runs): the TensorFlow/Reverb one (NumPy 1.26, with the benchmark smoke) and
# the NumPy 2 one (PyTorch, JAX; no TensorFlow; the shm plugin's tests and the frameworks
# part of the benchmark smoke), both on Python 3.11, and beside them py313, the newest
# Python supported (NumPy 2, JAX, no PyTorch), on most of the suite, and llm (vLLM's CPU
# build serving a tiny Llama that a trainer updates through varsync); last, their combined
# line coverage, failing under its floor. The lint gate first, then the worlds side by side
# (`tox run-parallel --parallel all`: most of their time is spent waiting on servers,
# timeouts and child processes, so on 2 cores the three take about what the longest,
# modern, takes alone; every test binds its own free ports in a network namespace of its
# own, and every store and namespace has a unique name, so they never meet). Any one failing fails the run;
# tox prints each environment's output whole when it ends (parallel_show_output). Each
# run prints which engines its environment lacks and which test files skipped for that.
# All under scripts/loopback-only: Reverb servers listen on every interface.
test: $(TOX)
	$(TOXRUN) -e lint
	$(TOXPAR) -e tf,modern,py313,llm
	$(TOXRUN) -e coverage

lint: $(TOX)
	$(TOXRUN) -e lint

# Every benchmark in benchmarks/ (one harness: benchmarks/suite.py), end to end in under
# 25 minutes on a 2-core machine: benchmarks/RESULTS.md, benchmarks/results.json and the
# plots in docs/img/ (matplotlib, the `bench` extra). The suite starts and stops its own
# Reverb and redis servers. The cross-backend group runs in .venv (TensorFlow, Reverb), the
# frameworks group (PyTorch, JAX) and the delta group (issue 16's delta sync on memory://,
# redis:// and shm://, 2-4 minutes) in tox's modern environment; each run rewrites its own
# part of RESULTS.md and results.json. `make test` runs every group as a smoke test
# (--smoke: tiny sizes, under a minute; it writes none of those files).
# Issue 15.2's PyTorch rows (benchmarks/torch_rounds.py) need torch beside Reverb, and
# without TF-Agents, whose typing-extensions==4.5.0 pin torch 2.13 refuses: an environment
# of its own, for make bench alone (torch pinned as in tox.ini's modern environment).
TORCH_VENV := .venv-torch
$(TORCH_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip --disable-pip-version-check -q install "torch==2.13.0" -e ".[reverb,torch]"
	touch $@

bench: tf-env
	$(PY) -c "import matplotlib" 2>/dev/null || $(PIP) install -e ".[all,test,bench]"
	scripts/loopback-only $(PY) -m benchmarks.suite --group cross-backend
	$(TOXRUN) -e modern --notest
	.tox/modern/bin/python -c "import matplotlib" 2>/dev/null || .tox/modern/bin/python -m pip --disable-pip-version-check -q install -e ".[bench]"
	scripts/loopback-only .tox/modern/bin/python -m benchmarks.suite --group frameworks --group delta

# Element deltas on a trained model (benchmarks/element_sync.py: a ~337 MB bf16 decoder,
# AdamW at 1e-6 and 1e-5, pushed after each step to memory://, redis:// and shm://,
# patched against whole-leaf sync; 5-10 minutes). Figures: docs/delta.md.
bench-elements: $(TOX)
	$(TOXRUN) -e modern --notest
	scripts/loopback-only .tox/modern/bin/python -m benchmarks.element_sync

# Trainer push -> vLLM serving the new version (benchmarks/vllm_sync.py, tox's llm
# environment): the tiny model of examples/llm_rl and a ~1 GB bf16 Llama, an AdamW step
# before each sync, over shm:// and redis:// against vLLM's own reload_weights from a
# safetensors file; two vLLM engines on CPU, one process each (10-15 minutes on 2
# cores). Figures: docs/vllm.md.
bench-vllm: $(TOX)
	$(TOXRUN) -e llm --notest
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 \
		scripts/loopback-only .tox/llm/bin/python -m benchmarks.vllm_sync

# Sharded pushes (benchmarks/sharded.py, issue 41): N = 2 and 4 rank processes pushing a
# 1 GiB bf16 model over redis://, each its own rows, against a gloo gather to rank 0 then
# one push, in the same rounds; readers of 1/2 and 1/4. Needs about 8 GiB free (it says
# so and stops otherwise); 3-6 minutes. Then element deltas per block
# (benchmarks/sharded_elements.py): 4 ranks, 256 MiB, 1 % changed per step, against
# blocks whole, in the same rounds; about a minute. Figures: docs/sharded.md ("Measured").
bench-sharded: $(TOX)
	$(TOXRUN) -e modern --notest
	scripts/loopback-only .tox/modern/bin/python -m benchmarks.sharded
	scripts/loopback-only .tox/modern/bin/python -m benchmarks.sharded_elements

# A bounded soak (tools/soak/), outside `make test`: per backend, a writer and three
# readers for SOAK_SECONDS, every pulled value checked, then the same with faults; pushes,
# pulls, inconsistencies (must be 0), leaks and memory growth of clients and servers.
# Figures: docs/guarantees.md.
SOAK_SECONDS ?= 60
soak: tf-env
	scripts/loopback-only $(PY) -m tools.soak --seconds $(SOAK_SECONDS)

# Tests that must hold on a loaded machine, run STRESS_RUNS times in a row beside two
# CPU-bound processes (tools/stress.py; CI shares 2 cores): by default every conformance
# test that checks versions never go back or mix, on a Redis replica, the Redis primary
# and memory://. Any failing run fails the target. STRESS_TESTS takes pytest arguments.
STRESS_RUNS  ?= 50
STRESS_TESTS ?= tests/backends/redis/test_redis_replicas.py tests/backends/redis/test_redis_backend.py tests/backends/memory/test_memory_backend.py -k "eight_threads or never_see_a_mix or never_lowers or primary_answered"
stress: $(TOX)
	$(TOXRUN) -e modern --notest
	scripts/loopback-only .tox/modern/bin/python -m tools.stress --runs $(STRESS_RUNS) --burners 2 -- $(STRESS_TESTS)

clean:
	rm -rf $(VENV) .venv-lint $(TORCH_VENV) .tox $(TOXENV_DIR) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
