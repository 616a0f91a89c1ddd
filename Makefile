# One command to set up and train, one to set up and test. The pinned torch is installed
# first, because any other spec pulls a multi-GB CUDA build; override with TORCH=... .
PYTHON ?= python3.11
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup train test test-fast clean

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml setup.py $(wildcard fastrl_ext/src/*.cpp fastrl_ext/src/*.h)
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

train: setup
	$(VENV)/bin/fastrl train --config configs/cartpole.yaml

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not integration and not learning and not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache
