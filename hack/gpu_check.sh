#!/usr/bin/env bash
# The worker's GPU check, one command on one GPU machine (a few minutes): nccl on every GPU, FSDP2,
# asynchronous checkpoint overlap, each fault kind recovered; prints a table (bench/gpu_check.py).
#
#   hack/gpu_check.sh                 # NVRx from the Python environment (the venv's 0.4.1)
#   hack/gpu_check.sh --nvrx06        # NVRx 0.6 from .nvrx06/ (make nvrx06) first on PYTHONPATH
#   PY=/usr/bin/python3 hack/gpu_check.sh --gpus 4 --model-dim 4096
#
# Needs a Python with CUDA torch and NVRx (PY, default .venv/bin/python; `make setup` makes one when
# PyPI is reachable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [[ ! -x "$PY" ]]; then make setup; fi
path=operator:worker
if [[ "${1:-}" == "--nvrx06" ]]; then
  shift
  [[ -f .nvrx06/.installed ]] || make nvrx06 PY="$PY"
  path=.nvrx06:$path
fi
nvidia-smi -L || true
PYTHONPATH=$path exec "$PY" bench/gpu_check.py "$@"
