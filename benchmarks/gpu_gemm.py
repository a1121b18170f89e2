"""Measure transformer-shaped GEMM throughput and copy bandwidth on the present GPU.

The cost model's ``gemm_efficiency`` (autotune/data/hardware.yaml) is the fraction of the dense peak that
training GEMMs reach. This script measures it on a real device for the GEMM shapes of Llama layers
(tokens x hidden -> qkv / o / mlp, after a TP split), and the device-to-device copy bandwidth
(the memory-bound optimizer step's ceiling). Results go to benchmarks/results/gpu_gemm_<gpu>.json.

Usage (on a GPU machine):  python benchmarks/gpu_gemm.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

# (label, hidden, ffn, kv_hidden) of real models; TP splits the output (column) or input (row) dimension.
MODELS = (("1b", 2048, 5632, 1024), ("7b", 4096, 11008, 4096), ("70b", 8192, 28672, 1024),
          ("405b", 16384, 53248, 1024))
TOKENS = (2048, 4096, 8192, 16384)
TP = (1, 2, 4, 8)


def _time_ms(fn, *, warmup: int = 3, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gemm_tflops(m: int, n: int, k: int, dtype: torch.dtype) -> float:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    ms = _time_ms(lambda: a @ b)
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def copy_gb_s(num_bytes: int = 4 << 30) -> float:
    src = torch.empty(num_bytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src))
    return 2 * num_bytes / (ms * 1e-3) / 1e9  # bytes read + written


def layer_gemms(hidden: int, ffn: int, kv: int, tp: int) -> list[tuple[str, int, int]]:
    """(name, n, k) of one Llama layer's forward GEMMs per TP rank (Megatron column/row split)."""
    return [("qkv", (hidden + 2 * kv) // tp, hidden), ("o", hidden, hidden // tp),
            ("mlp_up", 2 * ffn // tp, hidden), ("mlp_down", hidden, ffn // tp)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name()
    started = time.time()
    rows = []
    for label, hidden, ffn, kv in MODELS[: 2 if args.quick else None]:
        for tokens in TOKENS[: 2 if args.quick else None]:
            for tp in TP:
                for gemm, n, k in layer_gemms(hidden, ffn, kv, tp):
                    tflops = gemm_tflops(tokens, n, k, torch.bfloat16)
                    rows.append({"model": label, "tokens": tokens, "tp": tp, "gemm": gemm,
                                 "m": tokens, "n": n, "k": k, "bf16_tflops": round(tflops, 1)})
    square = {str(s): round(gemm_tflops(s, s, s, torch.bfloat16), 1) for s in (1024, 2048, 4096, 8192)}
    result = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
              "copy_gb_s": round(copy_gb_s(), 1), "square_bf16_tflops": square, "layer_gemms": rows,
              "seconds": round(time.time() - started, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu_gemm_{name.replace(' ', '_').lower()}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "layer_gemms"}, indent=1))
    print(f"wrote {path} ({len(rows)} GEMM shapes)")


if __name__ == "__main__":
    main()
