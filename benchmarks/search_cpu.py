"""``autotune search`` with real trials on this machine's CPU, end to end, for both trial stacks.

For each backend (torchrun: FSDP2 / DTensor / pipelining; deepspeed: the DeepSpeed engine) runs, as a user
would::

    autotune search --model tiny --gpus 4 --gpu cpu --device cpu --backend B --trials 8 \\
        --global-batch 16 --seq-len 128 --json

in a fresh runs directory, and records the wall time, the trials launched and their statuses (ok, pruned
by the pruner, failed, infeasible proposals that never launched), the best measured plan with the cost
model's prediction for it, and the top rows side by side. The cost model is the catalog's ``cpu`` device,
an order-of-magnitude entry (see autotune/data/hardware.yaml): the ratio shows how far off it is here; the
search's choice rests on the measurements. The load average is recorded with the numbers (a shared box).

Usage:  python benchmarks/search_cpu.py [--trials 8] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from autotune.trialrecord import record_of

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("torchrun", "deepspeed")


def _search(backend: str, trials: int, runs: Path) -> dict[str, Any]:
    argv = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        "tiny",
        "--gpus",
        "4",
        "--gpu",
        "cpu",
        "--device",
        "cpu",
        "--backend",
        backend,
        "--trials",
        str(trials),
        "--global-batch",
        "16",
        "--seq-len",
        "128",
        "--study",
        backend,
        "--out",
        str(runs),
        "--json",
    ]
    load_before = [round(x, 2) for x in os.getloadavg()]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{backend}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    study = optuna.load_study(study_name=backend, storage=f"sqlite:///{runs / backend / 'study.db'}")
    records = [record_of(t) for t in study.trials]
    statuses = collections.Counter(r.shown_status for r in records if not r.is_duplicate)
    trial_wall = [r.measured["wall_s"] for r in records if "wall_s" in r.measured]
    best = out["top"][0]
    return {
        "command": " ".join(argv[1:]),
        "wall_s": wall_s,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "launched": out["trials"]["launched_this_run"],
        "statuses": dict(statuses),
        "median_trial_wall_s": sorted(trial_wall)[len(trial_wall) // 2] if trial_wall else None,
        "best": {
            "plan": best["plan"],
            "measured_tokens_per_s": best["measured_tokens_per_s"],
            "predicted_tokens_per_s": best["predicted_tokens_per_s"],
        },
        "top": out["top"],
        "summary_md_has_measured": "## Measured" in (runs / backend / "best" / "summary.md").read_text(),
    }


def _plan_line(plan: dict[str, Any]) -> str:
    from autotune.plan import ParallelPlan
    from autotune.render import plan_summary

    return plan_summary(ParallelPlan.from_dict(plan))


def _markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# Real-trial search on the CPU (`tiny`, 4 gloo ranks, 16 x 128 tokens per step)",
        "",
        f"{doc['date']}, {doc['cpus']} CPUs. `autotune search ... --trials {doc['trials']}` per "
        "backend; predicted = the cost model for the catalog `cpu` device (order of magnitude, not "
        "calibrated).",
        "",
        "| backend | wall s | launched | statuses | median trial s | best measured plan "
        "| measured tok/s | predicted tok/s | measured / predicted | load before -> after |",
        "|" + "---|" * 10,
    ]
    for name, r in doc["backends"].items():
        b = r["best"]
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        lines.append(
            f"| {name} | {r['wall_s']:.0f} | {r['launched']} | {statuses} "
            f"| {r['median_trial_wall_s'] or 0:.1f} | {_plan_line(b['plan'])} "
            f"| {b['measured_tokens_per_s']:,.0f} | {b['predicted_tokens_per_s']:,.0f} "
            f"| {b['measured_tokens_per_s'] / b['predicted_tokens_per_s']:.2f} "
            f"| {r['load_before'][0]} -> {r['load_after'][0]} |"
        )
    for name, r in doc["backends"].items():
        lines += [
            "",
            f"## {name}: top measured plans",
            "",
            "| plan | measured tok/s | predicted tok/s |",
            "|---|---|---|",
        ]
        lines += [
            f"| {_plan_line(row['plan'])} | {row['measured_tokens_per_s'] or 0:,.0f} "
            f"| {row['predicted_tokens_per_s']:,.0f} |"
            for row in r["top"]
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {"trials": args.trials, "cpus": os.cpu_count(), "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            doc["backends"][backend] = _search(backend, args.trials, Path(tmp))
            print(
                backend,
                json.dumps({k: v for k, v in doc["backends"][backend].items() if k != "top"}),
                flush=True,
            )
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "search_cpu.md").write_text(_markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
