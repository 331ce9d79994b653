#!/bin/bash
# The GPU machine's one command: install the carried wheels without a registry, print the machine,
# then run the staged GPU suite (benchmarks/gpu_suite.py; its options pass through).
#
#   make gpu-wheels                                              # here, with a registry: .gpu-wheels/cp312/
#   bash benchmarks/gpu/device_run.sh --budget 480 --out gpu-run # there, from the repository's root
#
# Environment:
#   PYTHON               the interpreter with torch (default python3)
#   BERTCTL_WHEELS       the wheel folder (default .gpu-wheels/cpXY for that interpreter's version)
#   BERTCTL_WHEELS_INTO  target (default: pip --target BERTCTL_SITE, then that folder first on PYTHONPATH)
#                        or interpreter (pip installs into the interpreter's own site-packages)
#   BERTCTL_SITE         the --target folder (default $TMPDIR/bertctl-site-cpXY)
# Bad input (no such Python, a wheel missing or for another Python, no GPU) is one line and exit 2.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}

tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")' 2>/dev/null) || {
  echo "device_run: cannot run the Python '$PY' (set PYTHON to the interpreter with torch)" >&2; exit 2; }
# (asked once, printed below with the machine: importing torch costs seconds of the device's budget)
about=$("$PY" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()}")' 2>/dev/null) || {
  echo "device_run: the Python '$PY' has no torch (set PYTHON to the interpreter with torch)" >&2; exit 2; }
WHEELS=${BERTCTL_WHEELS:-$REPO/.gpu-wheels/$tag}
# which pinned packages this Python lacks, and their wheels for it (or one line saying what is missing)
listed=$("$PY" "$REPO/benchmarks/gpu/wheels.py" "$WHEELS") || exit 2
wheels=()
while IFS= read -r wheel; do [ -n "$wheel" ] && wheels+=("$wheel"); done <<< "$listed"

if [ ${#wheels[@]} -gt 0 ]; then
  pip=("$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
  case "${BERTCTL_WHEELS_INTO:-target}" in
    target)
      SITE=${BERTCTL_SITE:-${TMPDIR:-/tmp}/bertctl-site-$tag}
      "${pip[@]}" --upgrade --target "$SITE" "${wheels[@]}" >&2 || { echo "device_run: pip could not install ${wheels[*]} into $SITE" >&2; exit 2; }
      export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;;
    interpreter)
      "${pip[@]}" "${wheels[@]}" >&2 || { echo "device_run: pip could not install ${wheels[*]} into $PY" >&2; exit 2; } ;;
    *)
      echo "device_run: BERTCTL_WHEELS_INTO is '${BERTCTL_WHEELS_INTO}'; expected target or interpreter" >&2; exit 2 ;;
  esac
  echo "installed: ${wheels[*]##*/}"
fi

# the machine, before anything can go wrong
echo "machine: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo) memory"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /' || true
fi
echo "$about"

export PYTHONUNBUFFERED=1
cd "$REPO"
exec "$PY" benchmarks/gpu_suite.py "$@"
