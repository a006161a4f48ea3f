# The two set-up commands of the README. Each creates .venv from requirements.txt
# when it is missing (or older than requirements.txt), then does its job.
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: train test test-all test-fast lint format venv venv-gpu venv-tpu venv-hf xla-targets torch-baseline

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip
	$(VENV_PYTHON) -m pip install --quiet -r requirements.txt
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
