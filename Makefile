# The README's quickstart: both targets work on a fresh machine (they create the environment first).
#   make demo   environment + install + the main job on this machine (no GPU, no Slurm)
#   make test   environment + install + the whole test suite (what .ci/run calls)
PYTHON ?= python3
# PyTorch, pinned. PyPI's Linux wheel is the CUDA build (several GB of nvidia-* packages); for the
# CPU build on a machine without a local CPU wheel: make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: env demo test golden

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

demo: env
	$(BIN)/bertctl submit --cluster local --nexp 2 --follow

test: env
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

# regenerate tests/golden/ after an intended change to templates or cluster files (then read the diff)
golden: env
	BERTCTL_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/test_render.py tests/test_data_cli.py -k golden
