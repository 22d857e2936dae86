# The two commands of the README. Both work on a fresh machine with only Python 3.11:
# the first run creates .venv and installs torch (exactly 2.13.0, the CPU build: a looser
# spec would download a multi-GB CUDA build) and the project with all extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.numparity-installed
PYTEST_ARGS ?=

.PHONY: demo test lint venv clean docs docs-ref gpu-check wheels dist

# The demo's dashboard links each page to the manual (its "?"): built first, again only
# when its sources changed, and served from site/ (an editable install carries none).
MANUAL := site/index.html

demo: $(STAMP) $(MANUAL)
	NUMPARITY_MANUAL_DIR=$(CURDIR)/site $(VENV)/bin/numparity-server demo

$(MANUAL): $(STAMP) mkdocs.yml $(shell find docs -name '*.md')
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --quiet

# ruff, mypy and the import contracts (pyproject.toml [tool.importlinter], docs/design.md
# §7) are part of the tests: CI runs exactly this target.
test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

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
# tools/gpu_check.py). GPU_PYTHON: the Python whose torch has CUDA (default .venv's once
# it is made, else python3). No network: where the server's packages are missing, they
# are installed from wheels/ (`make wheels`, where there is network) into .gpu-check/.
# NUMPARITY_GPU_CHECK_FAKE=1: the dry run, with a fake GPU (tests/helpers/fake_cuda).
GPU_PYTHON ?= $(if $(wildcard $(STAMP)),$(PY),python3)
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

# The wheels `make gpu-check` installs on a machine without network, for that machine's
# Python (WHEELS_PYTHON, default 3.12) on x86-64 Linux; setuptools builds the checkout.
WHEELS_PYTHON ?= 3.12
WHEELS_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014,--platform $(p)_x86_64)
# The wheel a lab installs (numparity is not on PyPI), built as a release is: an sdist,
# then the wheel from it. dist/numparity-<version>-py3-none-any.whl; on a node
# `pip install './numparity-<version>-py3-none-any.whl[agent]'`.
dist: $(STAMP)
	$(PY) -m build --no-isolation --outdir dist .

wheels:
	mkdir -p wheels
	$(PYTHON) tools/gpu_check.py --requirements > wheels/requirements.txt
	$(PYTHON) -m pip download --quiet --only-binary=:all: --python-version $(WHEELS_PYTHON) \
		--implementation cp $(WHEELS_PLATFORMS) -d wheels -r wheels/requirements.txt \
		'setuptools>=77'

clean:
	rm -rf $(VENV) build dist *.egg-info site .gpu-check
