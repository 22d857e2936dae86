# The two commands of the README. Both work on a fresh machine with only Python 3.11:
# the first run creates .venv and installs torch (exactly 2.13.0, the CPU build: a looser
# spec would download a multi-GB CUDA build) and the project with all extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.numparity-installed
PYTEST_ARGS ?=
# The suite runs on every core (pytest-xdist): tests that share a fleet, a server or a
# built manual stay on one worker, the longest start first (tests/helpers/scheduling.py).
# TEST_WORKERS=0 runs it in this one process, in collection order.
TEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

.PHONY: demo test test-fast test-durations lint venv clean docs docs-ref gpu-check wheels dist \
	readme-assets

# The demo's dashboard links each page to the manual (its "?"): built first, again only
# when its sources changed, and served from site/ (an editable install carries none).
MANUAL := site/index.html

demo: $(STAMP) $(MANUAL)
	NUMPARITY_MANUAL_DIR=$(CURDIR)/site $(VENV)/bin/numparity-server demo

$(MANUAL): $(STAMP) mkdocs.yml $(shell find docs -name '*.md')
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --quiet

# The README's and the manual's sample of `make demo` and the fleet page's picture
# (docs/images/fleet.png), from one real run of it (tools/readme_assets.py: Chromium at
# /usr/bin/chromium or $$NUMPARITY_CHROMIUM, through Playwright): after a change to what
# the demo prints or the fleet page shows. tests/docs/test_readme_assets.py checks them.
readme-assets: $(STAMP) $(MANUAL)
	$(PY) tools/readme_assets.py

# ruff, mypy and the import contracts (pyproject.toml [tool.importlinter], docs/design.md
# §7) are part of the tests: CI runs exactly this target. The 30 slowest tests and the
# wall time close its output (docs/how-to/run-the-tests.md: the budget).
test: lint
	$(PY) -m pytest $(XDIST) --durations=30 $(PYTEST_ARGS)

# The unit tests alone, for development (a few minutes): no end-to-end folder, no test
# measured over a second. CI always runs the whole suite.
test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) --tier fast $(PYTEST_ARGS)

# Measures every test again into tests/durations.json, which orders the units (commit it
# when the suite's shape changed: a new slow module, a fixture shared differently).
test-durations: $(STAMP)
	NUMPARITY_TEST_DURATIONS_OUT=$(CURDIR)/tests/durations.json \
		$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy agent server docs/_gen
	$(VENV)/bin/lint-imports --no-cache

venv: $(STAMP)

# The manual (mkdocs.yml), strict: a broken link or anchor, or a page missing from the
# navigation, fails. NO_MKDOCS_2_WARNING: Material's end-of-life banner on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The manual's pages generated from the code (docs/_gen/reference.py): after a flag, a
# setting, an exit code, a metric or a route changes. `make test` checks they are current.
docs-ref: $(STAMP)
	$(PY) docs/_gen/reference.py

# A line per stage, and pip's own output (each package as it is collected, download
# progress on a terminal) for the two long ones: a first run takes minutes.
$(STAMP): pyproject.toml setup.py
	@echo "==> [1/4] the virtual environment $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] pip, upgraded"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> [3/4] torch 2.13.0, the CPU build (the largest download)"
	$(PY) -m pip install torch==2.13.0
	@echo "==> [4/4] numparity, editable, with its extras agent, server, dev, browser"
	$(PY) -m pip install -e '.[agent,server,dev,browser]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready"

# numparity's CUDA paths on this machine's GPU, in one table (docs/how-to/gpu-type.md;
# tools/gpu_check.py), each row printed as it finishes, each under a deadline. It runs
# under the Python whose torch sees a GPU: GPU_PYTHON when given, else the first of
# python3, python and .venv's (whose torch is the CPU build) that does; none: exit 2,
# naming each one and why. No network: where the server's packages are missing, they are
# installed from wheels/ (`make wheels`, where there is network) into .gpu-check/.
# NUMPARITY_GPU_CHECK_FAKE=1: the dry run, with a fake GPU (tests/helpers/fake_cuda).
GPU_PYTHON ?=
GPU_CHECK_ARGS ?=
gpu-check:
	GPU_PYTHON='$(GPU_PYTHON)' $(PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

# The wheels `make gpu-check` installs on a machine without network, for that machine's
# Python (WHEELS_PYTHON, default 3.12) on x86-64 Linux: the server's packages, numpy
# (installed only where the node has none), and the checkout's build requirements
# (setuptools, MkDocs and its theme: pip builds the checkout with them, offline).
WHEELS_PYTHON ?= 3.12
WHEELS_DIR ?= wheels
WHEELS_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014,--platform $(p)_x86_64)
# The wheel a lab installs (numparity is not on PyPI), built as a release is: an sdist,
# then the wheel from it. dist/numparity-<version>-py3-none-any.whl; on a node
# `pip install './numparity-<version>-py3-none-any.whl[agent]'`.
dist: $(STAMP)
	$(PY) -m build --no-isolation --outdir dist .

wheels:
	mkdir -p $(WHEELS_DIR)
	$(PYTHON) tools/gpu_check.py --requirements > $(WHEELS_DIR)/requirements.txt
	$(PYTHON) tools/gpu_check.py --build-requirements > $(WHEELS_DIR)/build-requirements.txt
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version $(WHEELS_PYTHON) \
		--implementation cp $(WHEELS_PLATFORMS) -d $(WHEELS_DIR) -r $(WHEELS_DIR)/requirements.txt \
		-r $(WHEELS_DIR)/build-requirements.txt 'numpy>=1.24'

clean:
	rm -rf $(VENV) build dist *.egg-info site .gpu-check
