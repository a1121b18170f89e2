"""Where the test suite's CPU goes: wall and CPU time of every test, and of the processes it starts.

A pytest plugin records, per test, its wall time and the CPU time of the pytest process and of the child
processes it waited for (``resource.getrusage``: a torchrun agent counts its ranks); Slurm's jobs and
PostgreSQL run outside the test's process tree and are not counted. Run the suite in one process with it,
under ``.ci/run``'s services for the whole suite (``-n 0``: one process; without it, on the xdist workers
as CI runs, each row carries its start and worker, a timeline), then summarise (the tests' own inner pytest
runs record too, under ids outside ``tests/``, and are left out):

    PYTHONPATH=$PWD SUITE_CPU_OUT=/tmp/suite_cpu.jsonl PYTEST_ADDOPTS="-p benchmarks.suite_cpu" ./.ci/run
    python benchmarks/suite_cpu.py /tmp/suite_cpu.jsonl   # writes benchmarks/results/suite_cpu.{jsonl,md}
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, kids = _cpu()
    at, start = time.time(), time.monotonic()
    yield
    own2, kids2 = _cpu()
    row = {"id": item.nodeid, "wall": time.monotonic() - start, "self": own2 - own, "children": kids2 - kids}
    row |= {"start": at, "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # a timeline on xdist workers
    with open(os.environ.get("SUITE_CPU_OUT", "suite_cpu.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _where(rows: list[dict], wall: float) -> str:
    """How the tests ran: in one process (the sum of their walls), or side by side on xdist workers (the
    span from the first test's start to the last one's end)."""
    workers = {r.get("worker", "") for r in rows}
    if len(workers) < 2:
        return f"in one process: {wall / 60:.1f} min of test wall time"
    span = max(r["start"] + r["wall"] for r in rows) - min(r["start"] for r in rows)
    return f"on {len(workers)} xdist workers: {span / 60:.1f} min from the first start to the last end"


def summary(rows: list[dict], top: int = 25) -> str:
    wall = sum(r["wall"] for r in rows)
    cpu = sum(r["self"] + r["children"] for r in rows)
    per_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = per_file[r["id"].split("::")[0]]
        f[0], f[1], f[2] = f[0] + r["wall"], f[1] + r["self"] + r["children"], f[2] + 1
    lines = [
        "# Where the test suite's CPU goes",
        "",
        f"{len(rows)} tests {_where(rows, wall)}, {cpu:,.0f} CPU-s "
        f"(the tests and the processes they waited for), {cpu / 2 / 60:.1f} min on 2 cores if both were busy "
        "all the time. `python benchmarks/suite_cpu.py` (its docstring has the command that records them).",
        "",
        "| file | tests | wall s | CPU s | CPU / wall |",
        "|---|---|---|---|---|",
    ]
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1][1])
    for name, (w, c, n) in ranked[:top]:
        lines.append(f"| {name} | {n} | {w:.1f} | {c:.1f} | {c / w:.2f} |")
    rest = ranked[top:]
    lines.append(
        f"| {len(rest)} other files | {sum(int(v[2]) for _, v in rest)} | {sum(v[0] for _, v in rest):.1f} "
        f"| {sum(v[1] for _, v in rest):.1f} | |"
    )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jsonl", type=Path, help="what the plugin recorded (SUITE_CPU_OUT)")
    parser.add_argument("--out", type=Path, default=_ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["id"].startswith("tests/")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.jsonl.resolve() != (args.out / "suite_cpu.jsonl").resolve():
        shutil.copyfile(args.jsonl, args.out / "suite_cpu.jsonl")
    (args.out / "suite_cpu.md").write_text(summary(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
