"""How long `autotune search` takes to say a model fits nowhere and name the cluster that would fit it.

The answer's hint ranks 2x, 4x, 8x... the GPU count until a plan fits (autotune/ranking.py); at the counts
where nothing fits every legal plan is judged. This script runs each case with this checkout and with
``--baseline REV`` (a temporary git worktree), alternating, ``--repeat`` times each, so both see the same
machine load; it records wall and CPU time and checks that both print the same answer.

    python benchmarks/fits_nowhere_speed.py --baseline 6259011 [--repeat 3]
    # writes benchmarks/results/fits_nowhere_speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("deepseek-v3 on 8 A100-40GB", ["--model", "deepseek-v3", "--gpus", "8", "--gpu", "a100-40gb"]),
    ("llama3-405b on 4 A100-40GB", ["--model", "llama3-405b", "--gpus", "4", "--gpu", "a100-40gb"]),
]


def run_once(tree: Path, argv: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, the one-line answer) of ``autotune search`` run from ``tree``'s sources."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "autotune", "search", *argv, "--backend", "simulate", "--out", out]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 2 or "fits nowhere" not in proc.stderr:
        raise SystemExit(f"{' '.join(argv)} in {tree}: expected 'fits nowhere', exit {proc.returncode}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stderr.strip().splitlines()[-1]


def measure(name: str, argv: list[str], trees: dict[str, Path], repeat: int) -> dict:
    runs: dict[str, list[tuple[float, float, str]]] = {label: [] for label in trees}
    for _ in range(repeat):
        for label, tree in trees.items():
            runs[label].append(run_once(tree, argv))
    answers = {r[2] for rs in runs.values() for r in rs}
    if len(answers) != 1:
        raise SystemExit(f"{name}: the answers differ: {sorted(answers)}")
    row: dict = {"case": name, "command": "autotune search " + " ".join(argv), "answer": answers.pop()}
    for label, rs in runs.items():
        row[label] = {
            "walls_s": [r[0] for r in rs],
            "wall_s_median": statistics.median(r[0] for r in rs),
            "cpu_s_median": statistics.median(r[1] for r in rs),
        }
    row["wall_ratio"] = row["this"]["wall_s_median"] / row["baseline"]["wall_s_median"]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=_ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    def git(*a: str) -> str:
        done = subprocess.run(["git", *a], cwd=_ROOT, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        git("worktree", "add", "--detach", str(base), args.baseline)
        try:
            trees = {"baseline": base, "this": _ROOT}
            rows = [measure(name, argv, trees, args.repeat) for name, argv in CASES]
        finally:
            git("worktree", "remove", "--force", str(base))
    result = {
        "baseline": git("rev-parse", "--short", args.baseline),
        "this": git("rev-parse", "--short", "HEAD") + (" (modified)" if git("status", "--porcelain") else ""),
        "cpus": len(os.sched_getaffinity(0)),
        "load_average": os.getloadavg(),
        "cases": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fits_nowhere_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "fits_nowhere_speed.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0


def _markdown(result: dict) -> str:
    lines = [
        "# `autotune search` on a cluster too small: time to the answer",
        "",
        f"Baseline {result['baseline']}, this {result['this']}; {result['cpus']} CPUs, load average "
        f"{[round(x, 2) for x in result['load_average']]} at the end. Runs alternate; medians of each.",
        "",
        "| case | baseline wall | this wall | ratio | baseline CPU | this CPU | answer (the same in both) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["cases"]:
        b, t = r["baseline"], r["this"]
        hint = r["answer"].split("; ")[-1]
        lines.append(
            f"| {r['case']} | {b['wall_s_median']:.1f} s | {t['wall_s_median']:.1f} s | "
            f"{r['wall_ratio']:.2f} | {b['cpu_s_median']:.1f} s | {t['cpu_s_median']:.1f} s | {hint} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
