# make run [PROFILE=name] | make test | make test-slow | make smoke | make bench | make server | make worker | make remote | make lock
# Each target builds .venv from scratch when it is missing or pyproject.toml changed.
# PROFILE (profiles/<name>.yaml, or `default`) rewrites params.yaml before the run; unset, params.yaml runs as it is.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Stage commands in dvc.yaml say `python -m stages.<name>`: the venv's python must come first.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: install lock run test test-slow smoke bench server worker remote clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned here (pyproject.toml takes a range): the CPU wheel on disk, never a CUDA build;
	# constraints.txt holds every other library at the version the tests passed with
	$(BIN)/pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

# Refresh constraints.txt: a fresh install of pyproject.toml's ranges (the newest each allows), frozen. Then run
# `make test` on it and commit both.
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/pip install --quiet torch==2.13.0
	$(LOCK_VENV)/bin/pip install --quiet -e ".[dev]"
	{ echo "# Every library's exact version for make install and CI (make lock rewrites it from pyproject.toml's ranges)"; \
	  $(LOCK_VENV)/bin/pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+cpu$$/torch==\1/'; } > constraints.txt
	rm -rf $(LOCK_VENV)

PROFILE ?=

run: $(STAMP)
	$(BIN)/python -m pipeline repro $(if $(PROFILE),--profile $(PROFILE))

# `make test` stays within 15 minutes on 2 cores; the tests marked slow (more whole-DAG runs) are `make test-slow`.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests -m "not slow" --durations=30

test-slow: $(STAMP)
	$(BIN)/python -m pytest tests -m slow --durations=10

smoke: $(STAMP)
	$(BIN)/python -m pytest tests -m "not e2e"

bench: $(STAMP)
	$(BIN)/python bench/synthesis.py
	$(BIN)/python bench/orchestration.py
	$(BIN)/python bench/sft_step.py
	$(BIN)/python bench/teacher_sampling.py
	$(BIN)/python bench/grpo_step.py
	$(BIN)/python bench/prm_scoring.py
	$(BIN)/python bench/prm_wide_vocab.py --paths 128 --repeats 1
	$(BIN)/python bench/animate.py
	$(BIN)/python bench/launch_sft.py
	$(BIN)/python bench/smollm2.py

server: $(STAMP)
	$(BIN)/prefect server start --host 127.0.0.1

# A worker for prefect.yaml's scheduled deployment; its work pool (process type) is made when missing.
# Needs PREFECT_API_URL (e.g. http://127.0.0.1:4200/api beside `make server`); then `prefect --no-prompt deploy --all`.
worker: $(STAMP)
	$(BIN)/python -m pipeline worker

# The default DVC remote of .dvc/config: a folder beside the repository (its url is relative to .dvc/).
remote: $(STAMP)
	mkdir -p "$$($(BIN)/dvc config remote.local.url)"
	$(BIN)/dvc remote list

clean:
	rm -rf $(VENV) data models
