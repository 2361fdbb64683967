# Two entry points for a fresh machine (only Python 3 and the package registries needed):
#   make quickstart   set up .venv and run the main job on its embedded default data
#   make test         set up .venv (and .venv-loaders) and run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first, by exact pin: a CPU wheel of 2.13.0 lies on disk here, anything looser pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

# optimum-onnx (sentence-transformers' ONNX backend) requires transformers < 4.58: the test that they load our
# exported graphs runs them in an environment of their own, beside the test venv's transformers 5.
LOADERS := .venv-loaders
LOADERS_PACKAGES := transformers==4.57.6 sentence-transformers==5.7.0 'optimum-onnx[onnxruntime]==0.1.0'

.PHONY: quickstart test venv loaders clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

$(LOADERS)/.installed: Makefile
	$(PYTHON) -m venv $(LOADERS)
	$(LOADERS)/bin/pip install --quiet --upgrade pip
	$(LOADERS)/bin/pip install --quiet $(TORCH)
	$(LOADERS)/bin/pip install --quiet $(LOADERS_PACKAGES)
	touch $@

loaders: $(LOADERS)/.installed

quickstart: venv
	$(BIN)/unmask quickstart

test: venv loaders
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(LOADERS) build src/*.egg-info .pytest_cache
