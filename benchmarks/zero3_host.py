"""Host time of DeepSpeed ZeRO-3's per-module machinery on this machine's CPU: the cost model's
``GPUSpec.zero3_host_module_s`` and ``zero3_host_bytes_per_s`` (catalog ``cpu`` entry).

ZeRO-3 runs Python around every module that holds parameters: a pre-forward hook fetches the module's
partitions (the parameter coordinator, its trace and prefetch bookkeeping), a post-forward hook releases them,
the same again in backward, and the optimizer steps over partitioned fp32 copies. On one rank no collective
moves any data, so the difference between a ZeRO-3 step and a ZeRO-0 step of the same model is that host
time. It is measured at 1 and at 2 micro-batches per step (micro-batch 2 and 1 of a 2-sequence batch) on two
models (``tiny``: 39 modules, 4.2 MB of fp32 parameters; ``small``: 75, 31.6 MB), and the two terms of
``costmodel.hostops.zero3_host_s`` are fitted to the four differences by least squares: per micro-batch and
module (the fetch / release hooks), and per step over the rank's parameter bytes (the optimizer over the
partitioned fp32 copies, the flat-buffer copies of parameters and gradients), with the module count the cost
model uses (``dpcomm.collective_calls``: one fetch per module that holds parameters, counted on the trials).

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host_bench import (  # noqa: E402
    alternate,
    fit_two_terms,
    init_one_rank,
    load_line,
    median_step_s,
    parse_args,
)

RESULTS = Path(__file__).resolve().parent / "results"


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
        plan = ParallelPlan(dp=1, global_batch=2, micro_batch=micro_batch, seq_len=64, framework="deepspeed")
        trainer = engine.DeepSpeedTrainer(plan=plan, config=TrialConfig(model=load_model(model_name),
                                                                        device="cpu"),
                                          device=torch.device("cpu"))
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
    from autotune.costmodel.dpcomm import collective_calls
    from autotune.plan import ParallelPlan

    load_before = list(os.getloadavg())
    models = ("tiny", "small")
    runs, med = alternate([(f"{name}-zero{stage}-mbs{mbs}",
                            functools.partial(_step_s, stage, mbs, name, args.steps))
                           for name in models for stage in (0, 3) for mbs in (2, 1)], args.repeats)
    dist.destroy_process_group()
    rows = []
    for name in models:
        spec = load_model(name)
        plan = ParallelPlan(dp=2, global_batch=4, micro_batch=2, seq_len=64, framework="deepspeed",
                            sharding="zero3")
        modules, _ = collective_calls(spec, plan, spec.num_params, spec.num_layers)
        one = med[f"{name}-zero3-mbs2"] - med[f"{name}-zero0-mbs2"]  # 1 micro-batch per step
        two = med[f"{name}-zero3-mbs1"] - med[f"{name}-zero0-mbs1"]  # 2 micro-batches per step
        rows.append({"model": name, "modules": modules, "param_bytes": 4 * spec.num_params,
                     "one_microbatch_s": one, "two_microbatches_s": two})
    # least squares of  diff = n_microbatches * modules * x + param_bytes * y  over the four differences
    per_module, per_byte = fit_two_terms([(n * r["modules"], r["param_bytes"], r[key]) for r in rows
                                          for n, key in ((1, "one_microbatch_s"), (2, "two_microbatches_s"))])
    for r in rows:
        for n, key in ((1, "one_microbatch_s"), (2, "two_microbatches_s")):
            r[key.replace("_s", "_fitted_s")] = n * r["modules"] * per_module + r["param_bytes"] * per_byte
    out = {"models": rows, "repeats": args.repeats, "steps": args.steps,
           "load_avg_before": load_before, "load_avg_after": list(os.getloadavg()),
           "step_s": runs, "median_step_s": med, "zero3_host_module_us": round(per_module * 1e6, 1),
           "zero3_host_gb_s": round(1 / per_byte / 1e9, 3) if per_byte else None,
           "command": "python benchmarks/zero3_host.py"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zero3_host.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# DeepSpeed ZeRO-3 host time (CPU, 1 rank)", "",
             f"Generated by `python benchmarks/zero3_host.py` ({args.repeats} alternating repeats x "
             f"{args.steps} steps, median; {load_line(load_before)}). ZeRO-3 minus ZeRO-0 step time of the "
             "trial's DeepSpeed engine on one rank, where no collective moves data.", "",
             "| model | modules | parameter bytes | ZeRO-0 step, 1 / 2 micro-batches | ZeRO-3 step, 1 / 2 | "
             "ZeRO-3 - ZeRO-0, 1 / 2 | fitted, 1 / 2 |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["model"]
        z0 = [med[f"{name}-zero0-mbs{b}"] * 1e3 for b in (2, 1)]
        z3 = [med[f"{name}-zero3-mbs{b}"] * 1e3 for b in (2, 1)]
        fitted = [r["one_microbatch_fitted_s"] * 1e3, r["two_microbatches_fitted_s"] * 1e3]
        lines.append(f"| {name} | {r['modules']} | {r['param_bytes'] / 1e6:.1f} MB | "
                     f"{z0[0]:.1f} / {z0[1]:.1f} ms | {z3[0]:.1f} / {z3[1]:.1f} ms | "
                     f"{z3[0] - z0[0]:.1f} / {z3[1] - z0[1]:.1f} ms | {fitted[0]:.1f} / {fitted[1]:.1f} ms |")
    gb_s = f"{out['zero3_host_gb_s']} GB/s" if per_byte else "none"
    lines += ["", f"Fitted: **{per_module * 1e6:.0f} us per module per micro-batch** and the rank's "
              f"parameter bytes once per step at **{gb_s}** (the catalog's `zero3_host_module_us`, "
              "`zero3_host_gb_s`)."]
    (args.out / "zero3_host.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
