# The two set-up commands of the README. Each creates .venv from requirements.txt
# when it is missing (or older than requirements.txt), installs the package into
# it (editable), then does its job.
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: train test test-all test-fast lint format notebook venv venv-gpu venv-tpu venv-hf xla-targets torch-baseline

venv: $(VENV)/.editable

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip
	$(VENV_PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

# The package itself, editable (pyproject.toml), without dependencies (the pins
# above stay): `.venv/bin/python` imports linformer_jax and configs from any
# folder and sees every edit of the tree. A marker of its own, so that a .venv
# made before this step gets it at the next `make`. Errors only (-qq): the one
# warning setuptools prints is its general notice about editable installs.
$(VENV)/.editable: $(VENV)/.installed pyproject.toml
	$(VENV_PYTHON) -m pip install -qq --no-deps --editable .
	touch $@

# An accelerator's environment: .venv plus JAX's CUDA 12 plugin and NVIDIA's
# libraries, or libtpu, at the jax version of requirements.txt. Runs then
# check the backend they find against config.platform (docs/scaling.md).
venv-gpu: venv
	$(VENV_PYTHON) -m pip install --quiet -r requirements-gpu.txt

venv-tpu: venv
	$(VENV_PYTHON) -m pip install --quiet -r requirements-tpu.txt

# XLA's GPU and TPU plugins, for compiling (never running) steps for an H100 or
# a TPU slice from this host: `mesh_memory --target` (docs/scaling.md). About
# 2 GiB, in their own folder so that no other command sees an accelerator.
XLA_TARGETS := .xla-targets
xla-targets: $(XLA_TARGETS)/.installed

$(XLA_TARGETS)/.installed: requirements-xla-targets.txt | venv
	rm -rf $(XLA_TARGETS)
	$(VENV_PYTHON) -m pip install --quiet --no-deps --target $(XLA_TARGETS) -r requirements-xla-targets.txt
	touch $@

# PyTorch and transformers for the export tests (tests/test_hf_export.py), which
# load an exported folder as its users do: an environment of their own, .venv-hf,
# at the versions of requirements-hf.txt, so that .venv never holds torch.
VENV_HF := .venv-hf
venv-hf: $(VENV_HF)/.installed

$(VENV_HF)/.installed: requirements-hf.txt
	$(PYTHON) -m venv $(VENV_HF)
	$(VENV_HF)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_HF)/bin/python -m pip install --quiet -r requirements-hf.txt
	touch $@

# The tour, experiments/linformer_tour.ipynb, in Jupyter Notebook: installs the
# pinned Jupyter packages of requirements-notebook.txt into .venv (once), then
# serves experiments/ and opens the notebook in a browser; Ctrl-C stops the
# server. On a remote host, `make notebook JUPYTER_FLAGS=--no-browser` prints
# the address to open instead. Jupyter refuses to serve as root unless told
# (a container's user often is root).
JUPYTER_FLAGS ?=
JUPYTER_AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
notebook: $(VENV)/.notebook
	$(VENV)/bin/jupyter notebook $(JUPYTER_AS_ROOT) $(JUPYTER_FLAGS) experiments/linformer_tour.ipynb

$(VENV)/.notebook: requirements-notebook.txt $(VENV)/.editable
	$(VENV_PYTHON) -m pip install --quiet -r requirements-notebook.txt
	touch $@

# Pretrains the default small Linformer on the embedded corpus (Python's own
# documentation): under 10 minutes on 2 CPU cores, prints validation perplexity.
train: venv
	$(VENV_PYTHON) -m linformer_jax.train --config configs/default.py --workdir runs/default

# Runs the test suite, one pytest-xdist worker per core, a test file per
# worker at a time (module fixtures run once), without the tests marked
# `long` (pytest.ini): under 10 minutes on 2 cores. `make test-all` runs
# every test. pytest's exit code 5 (no tests collected) counts as a failure.
PYTEST_PARALLEL := -n auto --dist loadfile
PYTEST = $(VENV_PYTHON) -m pytest -q $(PYTEST_PARALLEL)
NO_TESTS_FAIL = status=$$?; \
	if [ $$status -eq 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status
test: venv xla-targets venv-hf
	$(PYTEST) -m "not long"; $(NO_TESTS_FAIL)

test-all: venv xla-targets venv-hf
	$(PYTEST); $(NO_TESTS_FAIL)

# The edit loop: the suite without the tests marked slow (end-to-end runs of
# the training loop and the benchmarks, subprocesses, the notebook).
test-fast: venv xla-targets venv-hf
	$(VENV_PYTHON) -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

# Lint (ruff) and format check (pyink, Google style as Flax writes it); both are
# configured in pyproject.toml. `make format` rewrites the tree to pass.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyink --check --quiet .

format: venv
	$(VENV)/bin/ruff check --fix --exit-zero --quiet .
	$(VENV)/bin/pyink --quiet .

# The PyTorch baseline of `python -m linformer_jax.pytorch_comparison`: torch and
# lucidrains' linformer in an environment of their own, .venv-torch, with the
# transformers library of experiments/roberta_checkpoint.py and the HF test
# fixtures' script; none of them is ever a dependency of the project.
torch-baseline:
	$(PYTHON) -m venv .venv-torch
	.venv-torch/bin/pip install torch linformer==0.2.3 transformers
