"""Host time of FSDP2's per-unit machinery on this machine's CPU: the cost model's
``GPUSpec.fsdp_host_unit_s`` and ``fsdp_host_bytes_per_s`` (catalog ``cpu`` entry).

FSDP2 runs Python and copies around every unit it wraps (``fully_shard`` / ``replicate`` per block, then the
root): pre-forward unshard, post-forward reshard, pre-backward unshard, post-backward gradient copy-in to the
reduce buffer (``chunk_cat``), the pre-divide, the copy-out into the gradient, and the stream/event
bookkeeping. On one rank no collective moves data (FSDP2 copies instead of gathering or reducing), so the
difference between the trial model wrapped with FSDP2 (``TrialConfig.fsdp_at_dp1``, the validation mode that
wraps a one-rank model) and the same model unwrapped is that host time. It is measured on ``tiny`` (5 units)
and ``small`` (9 units) at 1 and 2 micro-batches per step (``fully_shard`` with reshard after forward; FSDP2's
``replicate`` runs the same per-unit machinery, ``_composable/replicate_with_fsdp.py``), and the two terms of
``costmodel.hostops.fsdp_host_s`` are fitted to the four differences by least squares: per unit and
micro-batch (hooks, bookkeeping) and per micro-batch over the rank's parameter bytes (the copies in and out of
the gather and reduce buffers).

Usage:  python benchmarks/fsdp_host.py [--repeats 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"


def _step_s(model_name: str, micro_batch: int, wrap: bool, steps: int) -> float:
    import torch

    from autotune.catalog import load_model
    from autotune.plan import ParallelPlan
    from autotune.trials.config import TrialConfig
    from autotune.trials.worker import make_trainer

    plan = ParallelPlan(dp=1, global_batch=2, micro_batch=micro_batch, seq_len=64)
    config = TrialConfig(model=load_model(model_name), device="cpu", fsdp_at_dp1=wrap)
    trainer = make_trainer(plan, config, torch.device("cpu"))
    for i in range(3):
        trainer.step(i)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        trainer.step(3 + i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29534"),
                      RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist

    from autotune.catalog import load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    load_before = list(os.getloadavg())
    models = ("tiny", "small")
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name in models:
            for wrap in (False, True):
                for mbs in (2, 1):
                    runs.setdefault(f"{name}-{'fsdp' if wrap else 'plain'}-mbs{mbs}", []).append(
                        _step_s(name, mbs, wrap, args.steps))
    dist.destroy_process_group()
    med = {k: statistics.median(v) for k, v in runs.items()}
    rows, eqs = [], []
    for name in models:
        spec = load_model(name)
        units, nbytes = spec.num_layers + 1, 4 * spec.num_params  # a unit per block, then the root; fp32
        for mbs, n in ((2, 1), (1, 2)):
            plain, wrapped = med[f"{name}-plain-mbs{mbs}"], med[f"{name}-fsdp-mbs{mbs}"]
            rows.append({"model": name, "units": units, "param_bytes": nbytes, "microbatches": n,
                         "plain_s": plain, "wrapped_s": wrapped, "diff_s": wrapped - plain})
            eqs.append((n * units, n * nbytes, wrapped - plain))
    # least squares of  diff = n_microbatches * (units * x + param_bytes * y)
    saa, sab, sbb = (sum(e[i] * e[j] for e in eqs) for i, j in ((0, 0), (0, 1), (1, 1)))
    sad, sbd = sum(e[0] * e[2] for e in eqs), sum(e[1] * e[2] for e in eqs)
    det = saa * sbb - sab * sab
    per_unit, per_byte = (sad * sbb - sbd * sab) / det, (sbd * saa - sad * sab) / det
    for r in rows:
        r["fitted_s"] = r["microbatches"] * (r["units"] * per_unit + r["param_bytes"] * per_byte)
    out = {"rows": rows, "repeats": args.repeats, "steps": args.steps, "load_avg_before": load_before,
           "load_avg_after": list(os.getloadavg()), "step_s": runs, "median_step_s": med,
           "fsdp_host_unit_us": round(per_unit * 1e6, 1),
           "fsdp_host_gb_s": round(1 / per_byte / 1e9, 3) if per_byte > 0 else None,
           "command": "python benchmarks/fsdp_host.py"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fsdp_host.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# FSDP2 host time per unit (CPU, 1 rank)", "",
             f"Generated by `python benchmarks/fsdp_host.py` ({args.repeats} alternating repeats x "
             f"{args.steps} steps, median; load average {[round(x, 2) for x in load_before]} -> "
             f"{[round(x, 2) for x in os.getloadavg()]}). The trial model wrapped with FSDP2 on one rank, "
             "where no collective moves data, minus the same model unwrapped.", "",
             "| model | units | micro-batches | unwrapped step | wrapped step | difference | fitted |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['units']} | {r['microbatches']} | "
                     f"{r['plain_s'] * 1e3:.1f} ms | {r['wrapped_s'] * 1e3:.1f} ms | "
                     f"{r['diff_s'] * 1e3:.1f} ms | "
                     f"{r['fitted_s'] * 1e3:.1f} ms |")
    gb_s = f"{out['fsdp_host_gb_s']} GB/s" if per_byte > 0 else "none"
    lines += ["", f"Fitted: **{per_unit * 1e6:.0f} us per unit per micro-batch** and the rank's parameter "
              f"bytes once per micro-batch at **{gb_s}** (the catalog's `fsdp_host_unit_us`, "
              "`fsdp_host_gb_s`)."]
    (args.out / "fsdp_host.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
