# The README's quickstart: both targets work on a fresh machine (they create the environment first).
#   make demo   environment + install + the main job on this machine (no GPU, no Slurm)
#   make test   environment + install + the whole test suite (what .ci/run calls)
PYTHON ?= python3
# the CPU build of PyTorch; an unpinned torch would pull several GB of CUDA packages
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: env demo test golden

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

demo: env
	$(BIN)/bertctl submit --cluster local --nexp 2 --follow

test: env
	$(BIN)/python -m pytest

# regenerate tests/golden/ after an intended change to templates or cluster files (then read the diff)
golden: env
	BERTCTL_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/test_render.py tests/test_data_cli.py -k golden
