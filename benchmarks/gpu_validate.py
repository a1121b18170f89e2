"""Validate the cost model against real world-size-1 trials of a ~1B Llama on one GPU.

Runs the trial worker's own measurement (``autotune.trials.worker.run_trial``: warm-up, then measured
steps timed with ``torch.cuda.synchronize``) in this process, one config after another, over
micro-batch (1, 2, 4, 8) x recompute (none, selective, full) x FSDP (none, fsdp-full: at world size 1
``fully_shard`` still wraps every block) in bf16, and compares each with ``autotune.costmodel.estimate``:
step time, and peak memory (``max_memory_allocated`` against the estimate less its fixed reserve;
``max_memory_reserved`` against the full estimate). Results are written after every config, so an
interrupted run keeps what it measured:

    benchmarks/results/gpu_validate.json   every config: measured, predicted, errors, environment
    benchmarks/results/gpu_validate.md     the table
    runs/gpu_validate/<config>/            each trial's result.json and progress.jsonl (git-ignored)

Imports only torch, yaml and autotune modules free of optuna/deepspeed. ``--dry-run`` is a CPU smoke
test: the ``tiny`` preset, two configs, gloo, written under ``runs/gpu_validate_dry/``.

Usage:  benchmarks/gpu_validate.sh            (H200: about 2-4 minutes; no new config after --budget-s 270,
                                              and the shell wrapper stops it at 6 minutes)
        benchmarks/gpu_validate.sh --dry-run  (CPU, seconds)
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.catalog import load_gpu, load_model, make_cluster  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402
from autotune.trials.config import TrialConfig  # noqa: E402
from autotune.trials.result import TrialResult, TrialStatus  # noqa: E402
from autotune.trials.worker import init_distributed, run_trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3

LLAMA_1B = ModelSpec(
    name="llama-1b (gpu_validate)",
    hidden_size=2048,
    num_layers=18,
    num_heads=16,
    num_kv_heads=8,
    ffn_hidden_size=5632,
    vocab_size=32000,
    max_seq_len=2048,
)
"""~1.0B parameters: TinyLlama-1.1B's widths with 18 layers."""
SEQ_LEN = 2048
MICRO_BATCHES = (1, 2, 4, 8)
RECOMPUTE = ("none", "selective", "full")
FSDP = (False, True)


def _configs(dry_run: bool) -> list[tuple[int, str, bool]]:
    if dry_run:
        return [(1, "none", False), (2, "full", True)]
    return [(mbs, rc, fsdp) for fsdp, rc, mbs in itertools.product(FSDP, RECOMPUTE, MICRO_BATCHES)]


def _name(mbs: int, recompute: str, fsdp: bool) -> str:
    return f"mbs{mbs}-rc_{recompute}-{'fsdp' if fsdp else 'nofsdp'}"


def _predict(model: ModelSpec, gpu: str, plan: ParallelPlan) -> dict[str, Any] | None:
    """The cost model's step time and memory; None while it cannot answer (it is optional here)."""
    try:
        from autotune.costmodel import estimate

        est = estimate(model, make_cluster(num_gpus=1, gpu=gpu), plan)
        mem = est.memory
        return {
            "step_time_s": est.step_time_s,
            "memory_bytes": mem.total_bytes,
            "memory_allocated_bytes": mem.total_bytes - mem.reserve_bytes,
            "memory_breakdown": mem.as_dict(),
            "feasible": est.feasible,
            "reasons": list(est.reasons),
        }
    except Exception as e:  # a cost model under construction must not stop the measurements
        return {"error": f"{type(e).__name__}: {e}"}


def _err(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or not measured:
        return None
    return (predicted - measured) / measured


def _measure(
    model: ModelSpec, plan: ParallelPlan, cfg: TrialConfig, device: torch.device, trial_dir: Path
) -> TrialResult:
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "progress.jsonl").unlink(missing_ok=True)
    try:
        result = run_trial(trial_dir, plan=plan, config=cfg, device=device)
    except torch.OutOfMemoryError as e:
        result = TrialResult(status=TrialStatus.OOM, error=str(e).splitlines()[0][:300])
    except Exception as e:
        result = TrialResult(status=TrialStatus.ERROR, error=f"{type(e).__name__}: {e}"[:300])
    result.write(trial_dir / "result.json")
    return result


def _row(
    name: str, mbs: int, recompute: str, fsdp: bool, result: TrialResult, pred: dict[str, Any] | None
) -> dict[str, Any]:
    extra = result.extra or {}
    pred = pred or {}
    return {
        "config": name,
        "micro_batch": mbs,
        "recompute": recompute,
        "fsdp": "fsdp-full" if fsdp else "none",
        "status": str(result.status),
        "error": result.error,
        "step_time_s": result.step_time_s,
        "step_time_cov": result.step_time_cov,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "peak_allocated_bytes": result.peak_memory_bytes,
        "peak_reserved_bytes": extra.get("peak_reserved_bytes"),
        "loss": result.loss,
        "predicted": pred,
        "step_time_error": _err(pred.get("step_time_s"), result.step_time_s),
        "allocated_error": _err(pred.get("memory_allocated_bytes"), result.peak_memory_bytes),
        "reserved_error": _err(pred.get("memory_bytes"), extra.get("peak_reserved_bytes")),
    }


def _fmt(value: float | None, scale: float = 1.0, spec: str = ".3f") -> str:
    return "-" if value is None else format(value / scale, spec)


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# GPU validation: {doc['model']['name']} on {doc['environment']['device_name']}",
        "",
        f"{doc['model']['num_params'] / 1e9:.2f}B parameters, seq {doc['seq_len']}, {doc['precision']}, "
        f"{doc['warmup_steps']} warm-up + {doc['measure_steps']} measured steps, world size 1. "
        "Error = (predicted - measured) / measured. FSDP at world size 1 is predicted as sharding "
        "none (a plan cannot shard over one rank). Predicted allocated = estimate less its fixed "
        "reserve.",
        "",
        "| plan | status | step s | pred s | err | alloc GiB | pred GiB | err | reserved GiB | pred GiB "
        "| err | tok/s | MFU |",
        "|" + "---|" * 13,
    ]
    for r in doc["results"]:
        p = r["predicted"] or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    r["config"],
                    r["status"],
                    _fmt(r["step_time_s"]),
                    _fmt(p.get("step_time_s")),
                    _fmt(r["step_time_error"], 0.01, "+.0f") + "%"
                    if r["step_time_error"] is not None
                    else "-",
                    _fmt(r["peak_allocated_bytes"], GIB, ".2f"),
                    _fmt(p.get("memory_allocated_bytes"), GIB, ".2f"),
                    _fmt(r["allocated_error"], 0.01, "+.0f") + "%"
                    if r["allocated_error"] is not None
                    else "-",
                    _fmt(r["peak_reserved_bytes"], GIB, ".2f"),
                    _fmt(p.get("memory_bytes"), GIB, ".2f"),
                    _fmt(r["reserved_error"], 0.01, "+.0f") + "%" if r["reserved_error"] is not None else "-",
                    _fmt(r["tokens_per_s"], 1.0, ".0f"),
                    _fmt(r["mfu"], 0.01, ".1f") + "%" if r["mfu"] else "-",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _flash_gqa(model: ModelSpec, device: torch.device) -> str:
    """Whether SDPA's flash kernel takes this model's GQA attention (else SDPA may fall back to math,
    whose O(s^2) scores would dominate the measured memory)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, model.num_heads, 256, model.head_dim, device=device, dtype=torch.bfloat16)
    kv = torch.randn(1, model.num_kv_heads, 256, model.head_dim, device=device, dtype=torch.bfloat16)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        return "yes"
    except RuntimeError as e:
        return f"no: {str(e).splitlines()[0][:200]}"


def _environment(device: torch.device, model: ModelSpec) -> dict[str, Any]:
    on_gpu = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device_name": torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.machine()})",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": platform.node(),
        "sdpa_flash_gqa": _flash_gqa(model, device) if on_gpu else "n/a",
    }


def _init_single_rank(device_pref: str) -> torch.device:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }.items():
        os.environ.setdefault(key, value)
    return init_distributed(device_pref)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU smoke test: tiny model, two configs")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results (GPU run), runs/gpu_validate_dry (--dry-run)",
    )
    parser.add_argument("--trials-dir", type=Path, default=ROOT / "runs" / "gpu_validate")
    parser.add_argument("--gpu", default="h200", help="catalog GPU for the prediction and the MFU peak")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=270.0, help="start no new config after this")
    args = parser.parse_args(argv)
    args.out = args.out or ROOT / ("runs/gpu_validate_dry" if args.dry_run else "benchmarks/results")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device; use --dry-run for the CPU smoke test")
    start = time.monotonic()
    device = _init_single_rank("cpu" if args.dry_run else "cuda")
    model, gpu = (load_model("tiny"), "cpu") if args.dry_run else (LLAMA_1B, args.gpu)
    seq_len = 64 if args.dry_run else SEQ_LEN
    peak = load_gpu(gpu).peak_flops("fp32" if args.dry_run else "bf16")
    name = "gpu_validate_dry" if args.dry_run else "gpu_validate"
    doc: dict[str, Any] = {
        "model": {**dataclasses.asdict(model), "num_params": model.num_params},
        "seq_len": seq_len,
        "precision": "fp32" if args.dry_run else "bf16",
        "gpu_catalog": gpu,
        "warmup_steps": args.warmup,
        "measure_steps": args.steps,
        "environment": _environment(device, model),
        "results": [],
        "skipped": [],
    }
    for mbs, recompute, fsdp in _configs(args.dry_run):
        label = _name(mbs, recompute, fsdp)
        if time.monotonic() - start > args.budget_s:
            doc["skipped"].append({"config": label, "why": f"time budget {args.budget_s:g} s spent"})
            continue
        plan = ParallelPlan(micro_batch=mbs, global_batch=mbs, seq_len=seq_len, recompute=recompute)
        cfg = TrialConfig(
            model=model,
            warmup_steps=args.warmup,
            measure_steps=args.steps,
            peak_flops_per_gpu=peak,
            device=device.type,
            fsdp_at_dp1=fsdp,
        )
        result = _measure(model, plan, cfg, device, args.trials_dir / label)
        doc["results"].append(_row(label, mbs, recompute, fsdp, result, _predict(model, gpu, plan)))
        print(
            f"{label}: {result.status} step {_fmt(result.step_time_s)} s "
            f"peak {_fmt(result.peak_memory_bytes, GIB, '.2f')} GiB",
            flush=True,
        )
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _write(args.out, name, doc)
    doc["wall_s"] = time.monotonic() - start
    _write(args.out, name, doc)
    torch.distributed.destroy_process_group()
    return 0


def _write(out: Path, name: str, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{name}.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(out / f"{name}.json")
    (out / f"{name}.md").write_text(_markdown(doc))


if __name__ == "__main__":
    sys.exit(main())
