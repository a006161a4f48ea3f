# The two set-up commands of the README. Each creates .venv from requirements.txt
# when it is missing (or older than requirements.txt), then does its job.
PYTHON ?= python3
VENV := .venv
VENV_PYTHON := $(VENV)/bin/python

.PHONY: test venv

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip
	$(VENV_PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

# Runs the whole test suite (about 5 minutes on 2 CPU cores).
# pytest's exit code 5 (no tests collected) counts as a failure.
test: venv
	$(VENV_PYTHON) -m pytest -q; status=$$?; \
	if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$status
