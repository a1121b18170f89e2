"""Host time of DeepSpeed ZeRO-3's machinery on this machine's CPU: the cost model's
``HostProfile.zero3_host_module_s`` and ``zero3_host_bytes_per_s`` (``autotune/data/cpu_device.yaml``).

ZeRO-3 runs Python around every module that holds parameters in every micro-batch (its parameter coordinator
fetches and releases them in forward and backward) and goes through the rank's parameter bytes in every
micro-batch (the flat fetch buffers, the gradients copied into their partitions). On one rank no collective
moves any data, so the difference between a ZeRO-3 step and a ZeRO-0 step of the same model is that host time.
It is measured on a 4-sequence batch in 1, 2 and 4 micro-batches on two models (``tiny``: 39 modules, 4.2 MB
of fp32 parameters; ``small``: 75, 31.6 MB), and the two terms of ``costmodel.hostops.zero3_host_s`` are
fitted to the six differences by least squares, both per micro-batch: per module (with the module count the
cost model uses, ``dpcomm.zero3_gathers``) and per parameter byte. The six differences grow in proportion to
the micro-batches (2026-12-01: tiny 20.4 / 39.5 / 78.9 ms, small 54.7 / 117.0 / 245.3 ms); forms with a
per-step term fit them worse (per module per step + per byte per micro-batch after the first: rms 23 %;
per module per micro-batch + per byte per step, this benchmark's earlier form: 30 %; this one: 5 %).

Runs the trial's own DeepSpeed engine (``trials.deepspeed_engine.DeepSpeedTrainer``) with the stage set in its
config (a ParallelPlan forbids sharding at DP = 1, so the stage is set here). Alternating repeats, median.

Usage:  python benchmarks/zero3_host.py [--repeats 5] [--steps 10]
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from benchmarks._host_bench import (  # noqa: E402
    alternate,
    fit_two_terms,
    init_one_rank,
    load_line,
    median_step_s,
    parse_args,
)

RESULTS = Path(__file__).resolve().parent / "results"
GLOBAL_BATCH = 4
ACCUMULATION = (1, 2, 4)
"""Micro-batches per step: micro-batch 4, 2 and 1 of the ``GLOBAL_BATCH``."""


def _step_s(stage: int, micro_batch: int, model_name: str, steps: int) -> float:
    import torch

    import autotune.trials.deepspeed_engine as engine
    from autotune.catalog import load_model
    from autotune.plan import ParallelPlan
    from autotune.trials.config import TrialConfig

    original = engine.trial_ds_config

    def with_stage(plan: Any, **kwargs: Any) -> dict[str, Any]:
        config = original(plan, **kwargs)
        config["zero_optimization"]["stage"] = stage
        return config

    engine.trial_ds_config = with_stage
    try:
        plan = ParallelPlan(
            dp=1, global_batch=GLOBAL_BATCH, micro_batch=micro_batch, seq_len=64, framework="deepspeed"
        )
        trainer = engine.DeepSpeedTrainer(
            plan=plan,
            config=TrialConfig(model=load_model(model_name), device="cpu"),
            device=torch.device("cpu"),
        )
    finally:
        engine.trial_ds_config = original
    seconds = median_step_s(trainer, steps)
    trainer.close()
    return seconds


def main() -> None:
    args = parse_args(__doc__, RESULTS)
    init_one_rank(29533)
    import torch.distributed as dist

    from autotune.catalog import load_model
    from autotune.costmodel.dpcomm import zero3_gathers

    load_before = list(os.getloadavg())
    models = ("tiny", "small")
    runs, med = alternate(
        [
            (
                f"{name}-zero{stage}-gas{gas}",
                functools.partial(_step_s, stage, GLOBAL_BATCH // gas, name, args.steps),
            )
            for name in models
            for stage in (0, 3)
            for gas in ACCUMULATION
        ],
        args.repeats,
    )
    dist.destroy_process_group()
    rows = []
    for name in models:
        spec = load_model(name)
        modules = zero3_gathers(spec, 1).modules
        for gas in ACCUMULATION:
            rows.append(
                {
                    "model": name,
                    "modules": modules,
                    "param_bytes": 4 * spec.num_params,
                    "micro_batches": gas,
                    "zero0_s": med[f"{name}-zero0-gas{gas}"],
                    "zero3_s": med[f"{name}-zero3-gas{gas}"],
                    "host_s": med[f"{name}-zero3-gas{gas}"] - med[f"{name}-zero0-gas{gas}"],
                }
            )
    # least squares of  host = micro-batches * (modules * x + param_bytes * y)  over all rows
    per_module, per_byte = fit_two_terms(
        [
            (r["micro_batches"] * r["modules"], r["micro_batches"] * r["param_bytes"], r["host_s"])
            for r in rows
        ]
    )
    for r in rows:
        r["fitted_s"] = r["micro_batches"] * (r["modules"] * per_module + r["param_bytes"] * per_byte)
    out = {
        "models": rows,
        "repeats": args.repeats,
        "steps": args.steps,
        "global_batch": GLOBAL_BATCH,
        "load_avg_before": load_before,
        "load_avg_after": list(os.getloadavg()),
        "step_s": runs,
        "median_step_s": med,
        "zero3_host_module_us": round(per_module * 1e6, 1),
        "zero3_host_gb_s": round(1 / per_byte / 1e9, 3) if per_byte > 0 else None,
        "command": "python benchmarks/zero3_host.py",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zero3_host.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        "# DeepSpeed ZeRO-3 host time (CPU, 1 rank)",
        "",
        f"Generated by `python benchmarks/zero3_host.py` ({args.repeats} alternating repeats x "
        f"{args.steps} steps, median; {load_line(load_before)}). ZeRO-3 minus ZeRO-0 step time of the "
        "trial's DeepSpeed engine on one rank, where no collective moves data; a "
        f"{GLOBAL_BATCH}-sequence batch in 1, 2 and 4 micro-batches.",
        "",
        "| model | modules | parameter bytes | micro-batches | ZeRO-0 step | ZeRO-3 step "
        "| ZeRO-3 - ZeRO-0 | fitted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ms = {k: f"{r[k] * 1e3:.1f} ms" for k in ("zero0_s", "zero3_s", "host_s", "fitted_s")}
        mb = r["param_bytes"] / 1e6
        lines.append(
            f"| {r['model']} | {r['modules']} | {mb:.1f} MB | {r['micro_batches']} "
            f"| {ms['zero0_s']} | {ms['zero3_s']} | {ms['host_s']} | {ms['fitted_s']} |"
        )
    gb_s = f"{out['zero3_host_gb_s']} GB/s" if per_byte > 0 else "none"
    lines += [
        "",
        f"Fitted: **{per_module * 1e6:.0f} us per module per micro-batch** and the rank's "
        f"parameter bytes once per micro-batch at **{gb_s}** (the catalog's `zero3_host_module_us`, "
        "`zero3_host_gb_s`).",
    ]
    (args.out / "zero3_host.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
