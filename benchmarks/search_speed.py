"""How long `autotune search` takes end to end in planning mode (cost model only, no GPU).

Each case runs the real command in a fresh interpreter (imports, enumeration of the whole space, the cost
model on every legal plan, the Optuna study in a new SQLite file, the emitted launch files) ``--repeat``
times; wall and CPU time of each run are recorded. Budgets (issue "Search end to end"): llama3-405b on
16,384 GPUs <= 10 s, 70b on 16 GPUs <= 3 s, on 2 cores.

    python benchmarks/search_speed.py [--repeat 5] [--baseline REV]
    # writes benchmarks/results/search_speed.{json,md}

Other processes on the machine inflate wall time; the load average is recorded next to the numbers and
the verdict uses the fastest run (the one least disturbed), as ``timeit`` does. ``--baseline REV`` also
runs every case from that revision (a temporary git worktree), alternating with this checkout so both see
the same load, records its medians beside these and fails unless both give the same answer (plans,
counts, the recommended plan).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    {
        "name": "llama3-405b on 16,384 H100",
        "budget_s": 10.0,
        "argv": ["--model", "llama3-405b", "--gpus", "16384"],
    },
    {
        "name": "llama3-405b on 16,384 H100, one process",
        "budget_s": None,
        "argv": ["--model", "llama3-405b", "--gpus", "16384"],
        "env": {"AUTOTUNE_PLAN_WORKERS": "1"},
    },
    {"name": "70b on 16 H100", "budget_s": 3.0, "argv": ["--model", "70b", "--gpus", "16"]},
    {
        "name": "llama3-405b on 16,384 H100, global batch 2048 (16M tokens)",
        "budget_s": None,
        "argv": ["--model", "llama3-405b", "--gpus", "16384", "--global-batch", "2048"],
    },
    {
        "name": "mixtral-8x7b on 16 H100",
        "budget_s": None,
        "argv": ["--model", "mixtral-8x7b", "--gpus", "16"],
    },
    {
        "name": "deepseek-v3 on 512 H100",
        "budget_s": None,
        "argv": ["--model", "deepseek-v3", "--gpus", "512"],
    },
    {
        "name": "mixtral-8x7b on 16 H100, progress bars on a terminal",
        "budget_s": None,
        "argv": ["--model", "mixtral-8x7b", "--gpus", "16"],
        "terminal": True,
    },
]
"""``env``: variables for that case's process (``AUTOTUNE_PLAN_WORKERS=1``: the cost model in one process,
autotune/rankworkers.py; the other cases use every CPU). ``terminal``: stderr is a pseudo-terminal, so the
search draws its progress bars as it does for a user at a shell (autotune/progress.py); stdout stays a pipe
for the ``--json`` answer."""
_ROOT = Path(__file__).resolve().parent.parent


def run_once(
    argv: list[str], env: dict[str, str] | None = None, terminal: bool = False, tree: Path = _ROOT
) -> tuple[float, float, dict]:
    """One end-to-end run of ``tree``'s sources: (wall s, CPU s of the child, its --json output);
    ``terminal``: stderr on a pty."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "autotune",
            "search",
            *argv,
            "--backend",
            "simulate",
            "--out",
            out,
            "--json",
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        returncode, stdout, stderr = _run(
            cmd, {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}, terminal, tree
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(stdout)


def _run(cmd: list[str], env: dict[str, str], terminal: bool, cwd: Path) -> tuple[int, str, str]:
    """(return code, stdout, stderr); with ``terminal`` stderr is a pseudo-terminal, drained by a thread so
    that the bars never block the child."""
    if not terminal:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env)
        return proc.returncode, proc.stdout, proc.stderr
    import pty
    import threading

    leader, follower = pty.openpty()
    drained: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed its end
                return
            if not chunk:
                return
            drained.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    child = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    out, _ = child.communicate()
    reader.join(timeout=5)
    os.close(leader)
    return child.returncode, out.decode(), b"".join(drained).decode(errors="replace")


_ANSWER = ("num_legal_plans", "num_feasible_plans", "pruned_by_reason", "plan", "tokens_per_s")
"""What a baseline run must answer as this checkout does."""


def measure(case: dict, repeat: int, baseline: Path | None = None) -> dict:
    runs, base_runs = [], []
    for _ in range(repeat):  # alternating, so both trees see the same load
        runs.append(run_once(case["argv"], case.get("env"), case.get("terminal", False)))
        if baseline is not None:
            base_runs.append(run_once(case["argv"], case.get("env"), case.get("terminal", False), baseline))
    walls, cpus, out = [r[0] for r in runs], [r[1] for r in runs], runs[-1][2]
    for _, _, other in base_runs:
        if any(other[k] != out[k] for k in _ANSWER):
            raise SystemExit(f"{case['name']}: the baseline answers differently")
    budget = case["budget_s"]
    row = {
        "case": case["name"],
        "command": " ".join(f"{k}={v}" for k, v in case.get("env", {}).items())
        + ("" if not case.get("env") else " ")
        + "autotune search "
        + " ".join(case["argv"])
        + " --backend simulate"
        + (" (stderr on a terminal)" if case.get("terminal") else ""),
        "budget_s": budget,
        "wall_s_min": min(walls),
        "wall_s_median": statistics.median(walls),
        "cpu_s_median": statistics.median(cpus),
        "walls_s": walls,
        "within_budget": None if budget is None else min(walls) <= budget,
        "legal_plans": out["num_legal_plans"],
        "feasible_plans": out["num_feasible_plans"],
        "pruned_combinations": sum(out["pruned_by_reason"].values()),
        "pruned_by_reason": out["pruned_by_reason"],
        "best_plan": out["plan"],
        "best_tokens_per_s": out["tokens_per_s"],
        "best_mfu": out["mfu"],
    }
    if base_runs:
        row["baseline_wall_s_median"] = statistics.median(r[0] for r in base_runs)
        row["baseline_cpu_s_median"] = statistics.median(r[1] for r in base_runs)
    return row


def _markdown(result: dict) -> str:
    lines = [
        "# `autotune search` speed (planning mode)",
        "",
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['platform']}, Python "
        f"{result['machine']['python']}; {result['machine'].get('plan_workers', 1)} planning worker(s) "
        f"(autotune/rankworkers.py); load average {result['load_before']} before, "
        f"{result['load_after']} after; commit {result['commit']}; {result['repeat']} runs per case.",
    ]
    base = result.get("baseline")
    if base:
        lines += [
            "",
            f"Baseline {base}, run alternately with this checkout from a git worktree (the same answers: "
            "plans, counts, recommended plan); its medians in the last two columns.",
        ]
    head = "| case | budget | fastest | median wall | median CPU | legal plans | fit | pruned |"
    lines += [
        "",
        head + (" baseline wall | baseline CPU |" if base else ""),
        "|---" * (10 if base else 8) + "|",
    ]
    for r in result["cases"]:
        budget = f"{r['budget_s']:.0f} s" if r["budget_s"] else "-"
        verdict = "" if r["within_budget"] is None else (" ok" if r["within_budget"] else " OVER")
        then = f" {r['baseline_wall_s_median']:.2f} s | {r['baseline_cpu_s_median']:.2f} s |" if base else ""
        lines.append(
            f"| {r['case']} | {budget} | {r['wall_s_min']:.2f} s{verdict} | "
            f"{r['wall_s_median']:.2f} s | {r['cpu_s_median']:.2f} s | {r['legal_plans']:,} | "
            f"{r['feasible_plans']:,} | {r['pruned_combinations']:,} |{then}"
        )
    for r in result["cases"]:
        lines += ["", f"## {r['case']}", "", f"`{r['command']}`", "", "Pruned by reason:", ""]
        lines += [f"- {n:,} {reason}" for reason, n in r["pruned_by_reason"].items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=_ROOT / "benchmarks" / "results")
    parser.add_argument("--baseline", help="git revision to run alternately with this checkout")
    args = parser.parse_args()

    def git(*a: str) -> str:
        done = subprocess.run(["git", *a], cwd=_ROOT, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") + (" (modified)" if git("status", "--porcelain") else "")
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline" if args.baseline else None
        if base is not None:
            git("worktree", "add", "--detach", str(base), args.baseline)
        try:
            cases = [measure(case, args.repeat, base) for case in CASES]
        finally:
            if base is not None:
                git("worktree", "remove", "--force", str(base))
    machine = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "plan_workers": len(os.sched_getaffinity(0)),  # rankworkers.workers() with no AUTOTUNE_PLAN_WORKERS
    }
    load_after = [round(x, 2) for x in os.getloadavg()]
    result = {
        "commit": commit,
        "baseline": git("rev-parse", "--short", args.baseline) if args.baseline else None,
        "load_before": load_before,
        "load_after": load_after,
        "machine": machine,
        "repeat": args.repeat,
        "cases": cases,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search_speed.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "search_speed.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0 if all(c["within_budget"] is not False for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
