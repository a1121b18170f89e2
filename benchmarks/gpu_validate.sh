#!/usr/bin/env bash
# Cost model vs real world-size-1 trials of a ~1B Llama on ONE GPU (H200: 2-4 minutes, killed at 6).
# Needs only python3 with torch (CUDA) and pyyaml; no optuna/deepspeed. Writes benchmarks/results/
# gpu_validate.{json,md} after every config and the trial directories under runs/gpu_validate/.
#   benchmarks/gpu_validate.sh              # the GPU run
#   benchmarks/gpu_validate.sh --dry-run    # CPU smoke test (tiny model)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec timeout --signal=INT --kill-after=20 "${GPU_VALIDATE_TIMEOUT_S:-360}" "${PYTHON:-python3}" benchmarks/gpu_validate.py "$@"
