# Two entry points for a fresh machine (only Python 3 and the package registries needed):
#   make quickstart   set up .venv and run the main job on its embedded default data
#   make test         set up .venv and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first, by exact pin: a CPU wheel of 2.13.0 lies on disk here, anything looser pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: quickstart test venv clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

quickstart: venv
	$(BIN)/unmask quickstart

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
