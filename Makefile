# Two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
ARGS ?=

.PHONY: demo test bench bench-scale lint debs engines venv clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
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

# pytest exits 5 when it collected no test: a run that tests nothing is a failure, said plainly.
# Real engines first (cached). Under CI=true a failed install fails the run; elsewhere the
# real-engine tests then say why they skip.
test: debs $(STAMP)
	@bash scripts/engines.sh || { case "$${CI:-}" in 1|true|yes) exit 1;; esac; \
	  echo "make test: real engines not installed; their tests will skip (CI=true makes that a failure)" >&2; }
	$(VENV)/bin/ruff check .
	@$(VENV)/bin/pytest -q $(ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5); that is a failure" >&2; fi; \
	exit $$rc

bench: debs $(STAMP)
	$(PY) -m bench.run $(ARGS)

# The exporter's scale benchmark alone (1 000 and 10 000 backends on the real 15 s schedule for 2 and 3
# intervals, the 10-1000 cycles, the parser; about 4 minutes), at a lower priority on a shared machine.
bench-scale: $(STAMP)
	nice -n 10 $(PY) -m bench.run --only scale $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info
