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

.PHONY: env demo test golden gpu-wheels

# A machine may set PYTHONDONTWRITEBYTECODE=1 (CI's does): no process would then keep the bytecode it
# compiles, and every one would compile what it imports from source again (torch: ~12 CPU-seconds
# each). Our commands write it, as Python does by default, into .venv/ and the gitignored __pycache__/.
unexport PYTHONDONTWRITEBYTECODE

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q --no-compile -e '.[test]'
	@# torch's bytecode now, on every core at once: every test process imports it, and three xdist workers
	@# importing it first at the same moment would each compile it. The rest is compiled by its first import
	@# (compiling all 13,600 files of site-packages took ~50 s of CI; most are never imported). A file written
	@# for a newer Python fails to compile here, as under pip: ignored
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/torch" > /dev/null || true
	touch $@

demo: env
	$(BIN)/bertctl submit --cluster local --nexp 2 --follow

# the whole suite in two passes: all but the timing-sensitive tests on three xdist workers (files whole,
# every Slurm file on one worker, the longest groups handed out first: tests/conftest.py), then the
# timing-sensitive ones alone on a quiet machine
test: env
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 3 --dist loadgroup --no-loadscope-reorder -m "not serial"; bulk=$$?; \
	$(BIN)/python -m pytest -m serial; serial=$$?; \
	test $$bulk -eq 0 -a $$serial -eq 0

# regenerate tests/golden/ after an intended change to templates or cluster files (then read the diff);
# a new run key with a default changes none (the scripts' run.yaml golden keeps only non-default keys)
golden: env
	BERTCTL_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/test_render.py tests/test_data_cli.py -k golden

# the wheels the GPU machine's Python lacks (pinned in benchmarks/gpu/requirements.txt), for CPython
# GPU_PYTHON on x86-64 Linux, into .gpu-wheels/cpXY/ (ignored; carry it to the GPU machine, where
# `bash benchmarks/gpu/device_run.sh` installs them without a registry). GPU_PYTHON=3.11: the CPU rehearsal's
GPU_PYTHON ?= 3.12
GPU_WHEELS ?= .gpu-wheels/cp$(subst .,,$(GPU_PYTHON))
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version $(GPU_PYTHON) \
	  $(foreach n,39 34 28 27 17,--platform manylinux_2_$(n)_x86_64) --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) -r benchmarks/gpu/requirements.txt
