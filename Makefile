# The two commands of the README: `make demo` and `make test`. Both set up what they need.
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.tools/node_modules/.bin:$(PATH)

.PHONY: setup demo test test-fast check lint typecheck imports unit bench docs clean

setup:
	@bash deploy/setup.sh

# DEMO_ARGS passes options to the demo, e.g. DEMO_ARGS="--rows 20000" (see --help).
demo: setup
	$(PY) -m icefloe.dev.demo $(DEMO_ARGS)

check: setup lint typecheck imports

lint:
	$(VENV)/bin/ruff check shared services tests tools
	$(VENV)/bin/ruff format --check shared services tests tools

typecheck:
	$(VENV)/bin/mypy

# The layering contracts of [tool.importlinter] in pyproject.toml.
imports:
	$(VENV)/bin/lint-imports

# A worker per core (`-n auto`; at most 4, since each worker starts the servers and JVMs
# its tests ask for), each test file on one worker (`--dist loadfile`), so module-scoped
# fixtures start once per file as in a serial run.
test: check docs
	$(PY) -m pytest -q --durations=15 -n auto --maxprocesses=4 --dist loadfile

# The fast tier, to run constantly while developing: the core's unit tests and the
# coordinator's state machines, no servers, a fifth of the Hypothesis examples (the `fast`
# profile; tests ask for examples(N), see tests/hypothesis_budget.py). Under a minute on
# 2 cores. CI runs `make test`, with every example.
test-fast: setup
	HYPOTHESIS_PROFILE=fast $(PY) -m pytest -q -m "not integration and not interop" \
		tests/shared tests/test_layering.py tests/test_tests_layout.py \
		tests/test_hypothesis_budget.py tests/services/coordinator/test_table_batcher.py

# The documentation site (mkdocs.yml, docs/) into site/, in strict mode: any warning (a broken
# link or anchor, a page left out of the navigation) fails. The settings and Helm values
# pages are generated from the code while it builds (services/icefloe/dev/docs_reference.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: setup
	$(PY) -m icefloe.dev.bench

clean:
	rm -rf $(VENV) .tools site .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
