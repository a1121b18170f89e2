#!/usr/bin/env bash
# The device checks issues 21-23 still need, as one command for a session lent one GPU (a few minutes on an
# H200; each step has its own timeout and writes its JSON as it goes, so a step that fails or runs out of
# time leaves the others' results):
#   1. FlexAttention at MLA's head widths (torchtitan's DeepSeek-V3 kernel): gpu_kernels.py --only=flex_mla
#   2. Llama 3 8B width, 4 layers: FSDP2 memory in bf16 and with torchao float8 linears (tensorwise,
#      rowwise), in the same run so fp8 is read against bf16 on one device: memory_crosscheck.py --gpu;
#      its JSON also holds what each further NCCL group costs (``nccl_next_group_bytes``, reserve.py)
# torchao is a test dependency, not a runtime one: put its wheel under .whl/ first and carry it to the device
#   pip download torchao==0.18.0 --no-deps -d .whl        (the run tool: carry [".whl"])
# Usage: OUT=DIR benchmarks/gpu_pending.sh   (results under $OUT, default runs/gpu_pending)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-runs/gpu_pending}"
mkdir -p "$out"
py="${PYTHON:-python3}"
shopt -s nullglob
wheels=(.whl/torchao-*.whl)
if ((${#wheels[@]})); then
  site="$(mktemp -d)"  # not under $out: only results travel back
  "$py" -m pip install --quiet --no-deps --no-index --target "$site" "${wheels[0]}" &&
    export PYTHONPATH="$PYTHONPATH:$site"
fi
"$py" -c "import torchao.float8" 2>/dev/null || echo "torchao missing: the fp8 memory cases will record an error"
status=0
timeout --signal=INT 240 "$py" benchmarks/gpu_kernels.py "$out" --only=flex_mla || status=1
for m in 8b 8b-fp8; do
  timeout --signal=INT 150 "$py" benchmarks/memory_crosscheck.py --gpu --gpu-model "$m" --out "$out" || status=1
done
ls -l "$out"
exit $status
