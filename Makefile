# The two commands of the README. Both work on a fresh machine with only Python 3.11:
# the first run creates .venv and installs torch (exactly 2.13.0, the CPU build: a looser
# spec would download a multi-GB CUDA build) and the project with all extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.numparity-installed
PYTEST_ARGS ?=

.PHONY: demo test lint venv clean

demo: $(STAMP)
	$(VENV)/bin/numparity-server demo

# ruff, mypy and the import contracts (pyproject.toml [tool.importlinter], docs/design.md
# §7) are part of the tests: CI runs exactly this target.
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy agent server
	$(VENV)/bin/lint-imports --no-cache

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[agent,server,dev,browser]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
