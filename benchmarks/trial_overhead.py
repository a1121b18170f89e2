"""Fixed cost of one real trial and the repeatability of its measurement, on this machine's CPU.

Runs the same tiny-model trial ``--repeats`` times through ``TorchrunBackend`` (gloo) and reports:

* launch -> first measured step: everything a trial pays before it measures (torchrun, worker imports,
  process group, model build, warm-up), split by the worker's marker files;
* the tail after the last step (result reduction, teardown, torchrun exit);
* repeat-trial CoV: coefficient of variation of the trials' median step times (the reported number), and
  as diagnostics the within-trial CoV and the repeat CoV of each trial's fastest step (less sensitive to
  other processes: a shared machine's load shows in the median, rarely in the minimum).

Targets (issue "Real trials"): launch -> first measured step <= 5 s; repeat-trial CoV <= 3 %.
CPU step times are noisy on a shared machine, so the load average is recorded with the numbers.

Usage:  python benchmarks/trial_overhead.py [--repeats 5] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.backends.base import TrialRequest  # noqa: E402
from autotune.backends.torchrun import TorchrunBackend  # noqa: E402
from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.trials.runner import Launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLANS = {"world1": ParallelPlan(global_batch=4, micro_batch=4, seq_len=128),
         "dp2": ParallelPlan(dp=2, global_batch=8, micro_batch=4, seq_len=128)}


def _mtime(trial_dir: Path, pattern: str) -> float:
    return max(p.stat().st_mtime for p in trial_dir.glob(pattern))


def _one(name: str, plan: ParallelPlan, trial_dir: Path, warmup: int, steps: int,
         threads: int | None) -> dict[str, Any]:
    cluster = make_cluster(num_gpus=plan.world_size, gpu="cpu")
    request = TrialRequest(model=load_model("tiny"), cluster=cluster, plan=plan, trial_dir=trial_dir,
                           timeout_s=300, warmup_steps=warmup, measure_steps=steps)
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    result = TorchrunBackend(device="cpu", launch=Launch(env=env)).run(request)
    if not result.ok:
        raise SystemExit(f"{name}: trial failed: {result.error}")
    launched, progress = result.extra["launched_at"], result.extra["progress"]
    first_start = progress[0]["time"] - progress[0]["step_time_s"]
    return {
        "launch_to_first_measured_step_s": first_start - launched,
        "launch_to_workers_started_s": _mtime(trial_dir, "started.*") - launched,
        "process_group_s": _mtime(trial_dir, "joined.*") - _mtime(trial_dir, "started.*"),
        "build_and_warmup_s": first_start - _mtime(trial_dir, "joined.*"),
        "after_last_step_s": result.wall_s - (progress[-1]["time"] - launched),
        "wall_s": result.wall_s, "median_step_s": result.step_time_s,
        "min_step_s": min(result.extra["step_times_s"][warmup:]),
        "within_trial_cov": result.step_time_cov,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [r["median_step_s"] for r in runs]
    fastest = [r["min_step_s"] for r in runs]
    keys = [k for k in runs[0] if k.endswith("_s") and k not in ("median_step_s", "min_step_s")]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys},
            "median_step_s": statistics.median(steps),
            "repeat_cov": statistics.pstdev(steps) / statistics.fmean(steps),
            "repeat_cov_of_min": statistics.pstdev(fastest) / statistics.fmean(fastest),
            "within_trial_cov": statistics.median(r["within_trial_cov"] for r in runs)}


def _markdown(doc: dict[str, Any]) -> str:
    lines = ["# Trial overhead and repeatability (CPU, gloo, `tiny` model)", "",
             f"{doc['repeats']} trials per layout after one discarded warm-up trial; {doc['warmup_steps']} "
             f"warm-up + {doc['measure_steps']} measured steps; medians over trials. Load average "
             f"{doc['load_before']} before, {doc['load_after']} after, on {doc['cpus']} CPUs. "
             "Targets: launch -> first measured step <= 5 s, repeat CoV <= 3 %.", "",
             "| layout | launch -> 1st measured step s | workers started s | build + warm-up s | tail s "
             "| wall s | step s | repeat CoV | in-trial CoV | repeat CoV of min step |", "|" + "---|" * 10]
    for name, s in doc["summary"].items():
        lines.append(f"| {name} | {s['launch_to_first_measured_step_s']:.2f} "
                     f"| {s['launch_to_workers_started_s']:.2f} | {s['build_and_warmup_s']:.2f} "
                     f"| {s['after_last_step_s']:.2f} | {s['wall_s']:.2f} "
                     f"| {s['median_step_s']:.4f} | {100 * s['repeat_cov']:.1f} % "
                     f"| {100 * s['within_trial_cov']:.1f} % | {100 * s['repeat_cov_of_min']:.1f} % |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS per rank (default: the runner's, CPUs / ranks)")
    parser.add_argument("--layouts", nargs="+", choices=sorted(PLANS), default=list(PLANS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"repeats": args.repeats, "warmup_steps": args.warmup, "measure_steps": args.steps,
                           "omp_num_threads": args.threads or "runner default (CPUs / ranks)",
                           "cpus": os.cpu_count(), "python": platform.python_version(),
                           "load_before": [round(x, 2) for x in os.getloadavg()], "runs": {}, "summary": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.layouts:
            plan, run = PLANS[name], functools.partial(_one, warmup=args.warmup, steps=args.steps,
                                                       threads=args.threads)
            run(name, plan, Path(tmp) / f"{name}-discard")  # page cache, .pyc files
            runs = [run(name, plan, Path(tmp) / f"{name}-{i}") for i in range(args.repeats)]
            doc["runs"][name], doc["summary"][name] = runs, _summary(runs)
            print(name, json.dumps(doc["summary"][name]), flush=True)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trial_overhead.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "trial_overhead.md").write_text(_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
