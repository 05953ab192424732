# Two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DIST_STAMP := $(VENV)/.dist-stamp
DIST ?= dist
ARGS ?=
TEST_WORKERS ?= 4
REAL_ALONE := tests/real/test_llamacpp.py

.PHONY: demo test bench bench-scale lint debs engines venv dist clean

# Python may cache the clone's own compiled modules (__pycache__/, ignored by git) even where the environment
# says PYTHONDONTWRITEBYTECODE: else every process the tests start (each xdist worker, exporter, remediator,
# simulator) compiles the project again, about 0.3 s of CPU each, and pytest rewrites every test module again.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,postgresql]'
	touch $(STAMP)

venv: $(STAMP)

# Debian packages for the real Prometheus, Alertmanager, promtool/amtool and HAProxy.
debs:
	@bash scripts/ensure-debs.sh

# Real engines for the real-engine tests (llama.cpp server, vLLM CPU, SGLang CPU, tiny models), cached outside
# the clone under ~/.cache/llm-health keyed by version: only the first run on a machine pays (6 min measured
# for llama.cpp, vLLM and the models, 3 min for SGLang, plus downloads).
engines: debs
	@bash scripts/engines.sh

demo: debs $(STAMP)
	$(VENV)/bin/llm-health demo $(ARGS)

# Three runs: everything but the real engines on TEST_WORKERS workers (pytest-xdist, --dist loadscope: a module
# stays on one worker, see tests/conftest.py); then the real engines, which are timed and must not share the
# machine with the rest: vLLM and SGLang on two workers (one engine each: their start-ups are imports, their
# stall windows idle; 3.8-4.3 min together against 6.3 one after the other, the stall bounds kept with margin),
# and llama.cpp alone after them (REAL_ALONE: its two compute threads wait on each other at every step and
# starve when another engine takes a CPU). ARGS: one run of those.
# pytest exits 5 when it collected no test: a run that tests nothing is a failure, said plainly.
# Real engines first (cached). Under CI=true a failed install fails the run; elsewhere the
# real-engine tests then say why they skip.
test: debs $(STAMP)
	@bash scripts/engines.sh || { case "$${CI:-}" in 1|true|yes) exit 1;; esac; \
	  echo "make test: real engines not installed; their tests will skip (CI=true makes that a failure)" >&2; }
	$(VENV)/bin/ruff check .
	@if [ -n "$(ARGS)" ]; then $(VENV)/bin/pytest -q $(ARGS); else \
	  $(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadscope --ignore=tests/real && \
	  $(VENV)/bin/pytest -q -n 2 --dist loadscope tests/real $(REAL_ALONE:%=--ignore=%) && \
	  $(VENV)/bin/pytest -q $(REAL_ALONE); fi; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); that is a failure" >&2; fi; \
	exit $$rc

# The wheel and sdist in $(DIST)/, for docs/install.md: built from this checkout with the venv's setuptools
# (no download, no isolated build env: python -m build --no-isolation builds the sdist, then the wheel from
# the unpacked sdist, so a file missing from the sdist fails here), then twine check --strict.
# The `dist` extra (build, twine) is installed the first time.
$(DIST_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -q -e '.[dist]'
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	rm -rf $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) .
	$(PY) -m twine check --strict $(DIST)/*
	@ls -1 $(DIST)

bench: debs $(STAMP)
	$(PY) -m bench.run $(ARGS)

# The exporter's scale benchmark alone (1 000 and 10 000 backends on the real 15 s schedule for 2 and 3
# intervals, the 10-1000 cycles, the parser; about 4 minutes), at a lower priority on a shared machine.
bench-scale: $(STAMP)
	nice -n 10 $(PY) -m bench.run --only scale $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info
