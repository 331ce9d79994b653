#!/usr/bin/env bash
# `bertctl export` with transformers 4.x, which the `export` extra allows (>=4.40) but `make test` does not
# install (it takes the newest, 5.x): a throwaway environment with the newest 4.x (or the version the argument
# names) runs tests/test_export.py. It prints the versions and pytest's summary; nothing here is part of CI (it
# downloads a second stack).
#   bash benchmarks/export_transformers4.sh             # the newest 4.x
#   bash benchmarks/export_transformers4.sh '==4.40.*'  # the oldest the export extra allows
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
spec=${1:->=4.40,<5}
torch_pin=$(sed -n 's/^TORCH ?= //p' Makefile)
env_dir=$(mktemp -d)
trap 'rm -rf "$env_dir"' EXIT
python3 -m venv "$env_dir"
"$env_dir/bin/python" -m pip install -q --upgrade pip
"$env_dir/bin/python" -m pip install -q --no-compile "$torch_pin"
# transformers 4.x takes huggingface_hub below 1.0 and its own tokenizers range: pip picks them
"$env_dir/bin/python" -m pip install -q --no-compile -e '.[test]' "transformers$spec"
"$env_dir/bin/python" - <<'PY'
import platform, huggingface_hub, tokenizers, torch, transformers
print(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"tokenizers {tokenizers.__version__}, huggingface_hub {huggingface_hub.__version__}")
PY
"$env_dir/bin/python" -m pytest -q -n 0 -p no:cacheprovider tests/test_export.py
