# The two set-up-and-go commands: `make serve` and `make test`. Both create .venv and install on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# A pinned torch: on CPU machines an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: serve test lint format install clean
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[models,test,dev]"
	touch $@

install: $(VENV)/.installed

serve: $(VENV)/.installed
	$(VENV)/bin/mstar serve $(ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check mstar tests
	$(VENV)/bin/ruff format --check mstar tests

test: lint
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix mstar tests
	$(VENV)/bin/ruff format mstar tests

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
