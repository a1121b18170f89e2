"""Run a list of plans in ONE torchrun launch (used by ``benchmarks/landscape.py``; not a user entry point).

``python -m torch.distributed.run ... benchmarks/_landscape_worker.py TODO.json OUT.jsonl``

Each plan goes through the trial worker's own ``run_trial`` (the same trainers, warm-up, synchronised timing
and max-over-ranks reduction as ``autotune search``); the torchrun launch (~3.5 s per trial on this machine,
benchmarks/results/trial_overhead.md) is shared by DeepSpeed ZeRO plans only. A torch-native trial gets a
launch of its own: the gloo groups of its device mesh, and their threads, live as long as the process
(``landscape._next_launch``).
The landscape measures time, not memory, so the worker's MemTracker warm-up step is replaced by a plain step
(it costs seconds per plan on 2 cores). Rank 0 appends one JSON line per plan to OUT.jsonl.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from autotune.plan import ParallelPlan
from autotune.trials import worker
from autotune.trials.config import TrialConfig


def _untracked_step(trainer, step: int):  # type: ignore[no-untyped-def]
    return (*trainer.step(step), None)


def main() -> None:
    todo = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    worker._tracked_step = _untracked_step  # benchmark harness only: time, not memory
    device = worker.init_distributed("cpu")
    rank = dist.get_rank()
    for item in todo:
        trial_dir = Path(item["trial_dir"])
        trial_dir.mkdir(parents=True, exist_ok=True)
        plan = ParallelPlan.from_dict(item["plan"])
        config = TrialConfig.from_dict(item["config"])
        start = time.perf_counter()
        record = {"key": item["key"], "repeat": item["repeat"]}
        try:
            result = worker.run_trial(trial_dir, plan=plan, config=config, device=device)
        except Exception as e:  # noqa: BLE001 - recorded; peers that did not fail are stopped by the timeout
            traceback.print_exc()
            record |= {"status": "error", "error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        else:
            warm = config.warmup_steps
            record |= {
                "status": str(result.status),
                "step_time_s": result.step_time_s,
                "step_times_s": result.extra["step_times_s"][warm:] if result.extra else None,
                "step_time_cov": result.step_time_cov,
            }
        gc.collect()
        record |= {
            "in_process_s": time.perf_counter() - start,
            "load_avg": list(os.getloadavg()),
            "time": time.time(),
        }
        if rank == 0:
            with out.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if record["status"] == "error":
            sys.stderr.flush()
            os._exit(1)  # the driver relaunches from the next plan
    worker._teardown()
    os._exit(0)


if __name__ == "__main__":
    main()
