# The two commands a new user runs: `make demo` and `make test`. Both set themselves up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Core only: numpy and pluggy. Enough for the embedded (memory) demo.
$(VENV)/.core-installed: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

# Everything the test suite needs: Reverb (TensorFlow), redis-py, pytest, hypothesis.
$(VENV)/.all-installed: pyproject.toml | $(PY)
	$(PIP) install -e ".[all,test]"
	touch $@ $(VENV)/.core-installed

demo: $(VENV)/.core-installed
	$(PY) examples/learner_actors.py

test: $(VENV)/.all-installed
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
