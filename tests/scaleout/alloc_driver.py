"""Run inside a Slurm allocation (``salloc -N 2 python alloc_driver.py OUT``): trials as ``srun`` steps.

The executor sees ``SLURM_JOB_ID`` and picks steps: a 2-node trial of the tiny model, then a 3-node trial
the allocation cannot hold. Prints one JSON object: trial name -> status, error, cmd.txt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trial_requests import PLAN, make_request

from autotune.executors import get_executor
from autotune.plan import ParallelPlan
from autotune.trials.runner import trial_config


def main(out: Path) -> None:
    executor = get_executor("slurm")
    trials = {"two-nodes": (PLAN, 2), "three-nodes": (ParallelPlan(dp=3, global_batch=3, seq_len=32), 3)}
    report = {"job_id": executor.env["SLURM_JOB_ID"]}
    for name, (plan, num_nodes) in trials.items():
        request = make_request(plan, out / name, num_nodes=num_nodes, timeout_s=90)
        result = executor.run(request, config=trial_config(request, device="cpu"))
        cmd = out / name / "cmd.txt"
        report[name] = {
            "status": str(result.status),
            "error": result.error,
            "cmd": cmd.read_text() if cmd.exists() else None,
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
