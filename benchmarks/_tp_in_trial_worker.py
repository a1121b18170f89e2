"""One torchrun launch of ``benchmarks/tp_in_trial.py``: build a plan's trainer as the trial worker does,
warm up, then time steps with and without ``torch.profiler`` and sum the gloo collectives each rank ran.

``python -m torch.distributed.run --nproc-per-node N benchmarks/_tp_in_trial_worker.py PLAN_JSON OUT.jsonl``
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.trials import worker
from autotune.trials.config import TrialConfig

WARMUP, PLAIN, PROFILED = 3, 3, 3


def main() -> None:
    plan = ParallelPlan.from_dict(json.loads(sys.argv[1]))
    device = worker.init_distributed("cpu")
    trainer = worker.make_trainer(plan, TrialConfig(model=load_model("tiny"), device="cpu"), device)
    step = 0
    plain = []
    for _ in range(WARMUP + PLAIN):
        dist.barrier()
        start = time.perf_counter()
        trainer.step(step)
        plain.append(time.perf_counter() - start)
        step += 1
    profiled = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED):
            dist.barrier()
            start = time.perf_counter()
            trainer.step(step)
            profiled.append(time.perf_counter() - start)
            step += 1
    ops: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        if e.key.startswith("gloo:") or e.key == "_c10d_functional::wait_tensor":
            ops[e.key][0] += e.cpu_time_total * 1e-6 / PROFILED  # seconds per step
            ops[e.key][1] += e.count / PROFILED
    row = {
        "rank": dist.get_rank(),
        "plain_step_s": plain[WARMUP:],
        "profiled_step_s": profiled,
        "ops": {k: {"s_per_step": v[0], "calls_per_step": v[1]} for k, v in sorted(ops.items())},
    }
    rows: list = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"plan": plan.to_dict(), "ranks": rows}) + "\n")
    worker._teardown()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
