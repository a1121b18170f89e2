"""Where the TP collectives' time goes inside real 4-rank CPU trials, against what the cost model charges.

The 4-rank torchrun landscape cells are the ones the calibrated model misses most (calibration_summary.md):
after the fit, TP2 x DP2 plans without SP are predicted 8-16 % fast and TP4 plans up to 7 % slow. This runs
the same trainer as a trial (``trials.worker.make_trainer``; tiny, global batch 8 x 64, micro-batch 2, no
sharding) for TP2 x DP2 and TP4, each with and without SP, in ``--launches`` fresh torchrun launches: 3
warm-up steps, 3 timed steps, 3 steps under ``torch.profiler`` (CPU), whose gloo collectives
(``gloo:all_reduce``, ``gloo:all_gather``; gloo has no reduce-scatter, so SP's reductions are all-reduces) are
summed per step and rank. The profiler slows the step (the ratio is reported), so compare ratios between
plans, not absolute times. The cost model's side: the uncalibrated step-time breakdown (``tp_comm_s``,
``dp_comm_s``) on the committed 4-rank probe profile. Run it on an otherwise idle machine.

Usage:  python benchmarks/tp_in_trial.py [--launches 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.costmodel.steptime import step_time  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.probe.profile import with_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROFILE = RESULTS / "profiles" / "cpu-4rank.yaml"
BASE = {
    "pp": 1,
    "cp": 1,
    "micro_batch": 2,
    "global_batch": 8,
    "seq_len": 64,
    "sharding": "none",
    "recompute": "none",
    "schedule": "1f1b",
    "virtual_stages": 1,
    "offload": False,
    "precision": "bf16",
    "framework": "fsdp",
}
PLANS = [
    {"tp": 2, "dp": 2, "sequence_parallel": False},
    {"tp": 2, "dp": 2, "sequence_parallel": True},
    {"tp": 4, "dp": 1, "sequence_parallel": False},
    {"tp": 4, "dp": 1, "sequence_parallel": True},
]


def _launch(plan: dict[str, Any], out: Path) -> None:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "4",
        str(ROOT / "benchmarks" / "_tp_in_trial_worker.py"),
        json.dumps(plan),
        str(out),
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=600)


def _summary(plan: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [r for run in runs for r in run["ranks"]]
    med = statistics.median

    def op(name: str, key: str) -> float:
        return med(r["ops"].get(name, {}).get(key, 0.0) for r in ranks)

    p = ParallelPlan.from_dict(plan)
    model, cluster = (
        load_model("tiny"),
        with_profile(make_cluster(num_gpus=4, gpu="cpu", gpus_per_node=4), PROFILE),
    )
    b = step_time(model, cluster, p)
    ar_s, ar_n = op("gloo:all_reduce", "s_per_step"), op("gloo:all_reduce", "calls_per_step")
    ag_s, ag_n = op("gloo:all_gather", "s_per_step"), op("gloo:all_gather", "calls_per_step")
    plain = med(max(r["plain_step_s"][i] for r in run["ranks"]) for run in runs for i in range(3))
    profiled = med(max(r["profiled_step_s"][i] for r in run["ranks"]) for run in runs for i in range(3))
    return {
        "plan": {k: plan[k] for k in ("tp", "dp", "sequence_parallel")},
        "step_s": plain,
        "profiled_step_s": profiled,
        "profiler_slowdown": profiled / plain,
        "gloo_all_reduce": {"s_per_step": ar_s, "calls_per_step": ar_n, "s_per_call": ar_s / max(ar_n, 1)},
        "gloo_all_gather": {"s_per_step": ag_s, "calls_per_step": ag_n, "s_per_call": ag_s / max(ag_n, 1)},
        "gloo_share_of_profiled_step": (ar_s + ag_s) / profiled,
        "model": {
            "step_s": b.step_time_s,
            "tp_comm_s": b.tp_comm_s,
            "dp_comm_s": b.dp_comm_s,
            "overhead_s": b.overhead_s,
            "compute_s": b.compute_s,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "tp_in_trial.json")
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, extra in enumerate(PLANS):
            plan = BASE | extra
            out = Path(tmp) / f"{i}.jsonl"
            for _ in range(args.launches):
                _launch(plan, out)
            runs = [json.loads(line) for line in out.read_text().splitlines()]
            rows.append(_summary(plan, runs))
            r, ar, ag = rows[-1], rows[-1]["gloo_all_reduce"], rows[-1]["gloo_all_gather"]
            print(
                r["plan"],
                f"step {r['step_s'] * 1e3:.0f} ms (model {r['model']['step_s'] * 1e3:.0f});",
                f"gloo AR {ar['s_per_call'] * 1e3:.2f} ms x {ar['calls_per_step']:.0f},",
                f"AG {ag['s_per_call'] * 1e3:.2f} ms x {ag['calls_per_step']:.0f};",
                f"model tp_comm {r['model']['tp_comm_s'] * 1e3:.0f} ms",
            )
    args.out.write_text(
        json.dumps(
            {
                "command": "python benchmarks/tp_in_trial.py",
                "launches": args.launches,
                "profile": str(PROFILE.relative_to(ROOT)),
                "load_before": load_before,
                "load_after": list(os.getloadavg()),
                "plans": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
