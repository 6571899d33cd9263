#!/usr/bin/env bash
# The worker's GPU check: one command on one offline GPU machine (about 8 minutes), one table
# (bench/gpu_check.py). It uses the machine's python3 and torch, and NVRx 0.6 from .gpu-bundle/,
# installed without network into a temporary folder; nothing else is installed or changed.
#
#   make gpu-bundle            # first, where PyPI is reachable: NVRx 0.6 and its dependencies (~12 MiB)
#   hack/gpu_check.sh          # on the GPU machine, with .gpu-bundle/ carried in the working tree
#   hack/gpu_check.sh --cpu    # the same checks with gloo on CPU (anywhere; no bundle: the environment's NVRx)
#
# PY (default python3) and GPU_BUNDLE (default .gpu-bundle) override; other arguments go to gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
BUNDLE=${GPU_BUNDLE:-.gpu-bundle}
shopt -s nullglob
wheels=("$BUNDLE"/*.whl)
path=operator:worker
if ((${#wheels[@]})); then
  site=$(mktemp -d "${TMPDIR:-/tmp}/rtj-gpu-check-site.XXXXXX")
  trap 'rm -rf "$site"' EXIT
  pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if "$PY" -m pip --version >/dev/null 2>&1; then
    # --platform: NVRx's wheels are tagged glibc 2.39; their Python parts run on older glibc too (only
    # the CUPTI straggler extension would not load). pip does not expand manylinux_2_39 into the older
    # tags the other wheels carry: all are named. A bundle for another Python fails here, clearly.
    platforms=()
    for minor in $(seq 39 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
    platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
    "$PY" -m pip install -q --no-index --no-deps --target "$site" --only-binary=:all: "${platforms[@]}" \
      --python-version "$pyver" --implementation cp "${wheels[@]}"
  else  # no pip in the image: a wheel is a zip of what the target folder would hold
    for wheel in "${wheels[@]}"; do "$PY" -m zipfile -e "$wheel" "$site"; done
  fi
  path=$site:$path
  echo "NVRx from $BUNDLE (${#wheels[@]} wheels, $(du -sh "$BUNDLE" | cut -f1)) into $site"
elif [[ " $* " != *" --cpu "* ]]; then
  echo "no wheels in $BUNDLE: run 'make gpu-bundle' where PyPI is reachable and carry $BUNDLE" >&2
  exit 2
fi
nvidia-smi -L 2>/dev/null || true
PYTHONPATH=$path "$PY" bench/gpu_check.py "$@"
