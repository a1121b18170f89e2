"""What benchmarks/fsdp_host.py and zero3_host.py share: a one-rank gloo group, a trainer's median step time,
and the two-term least-squares fit of the host time they measure."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def init_one_rank(port: int) -> None:
    """A one-rank gloo process group (DeepSpeed and FSDP2 need one), one thread as a CPU trial rank runs."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=os.environ.get("MASTER_PORT", str(port)),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")


def median_step_s(trainer: Any, steps: int, warmup: int = 3) -> float:
    """Median wall time of ``trainer.step`` after ``warmup`` steps."""
    for i in range(warmup):
        trainer.step(i)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        trainer.step(warmup + i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit_two_terms(eqs: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of ``d = a x + b y`` over ``(a, b, d)`` rows, through the origin: ``(x, y)``."""
    saa, sab, sbb = (sum(e[i] * e[j] for e in eqs) for i, j in ((0, 0), (0, 1), (1, 1)))
    sad, sbd = sum(e[0] * e[2] for e in eqs), sum(e[1] * e[2] for e in eqs)
    det = saa * sbb - sab * sab
    return (sad * sbb - sbd * sab) / det, (sbd * saa - sad * sab) / det


def load_line(before: list[float]) -> str:
    """``load average [..] -> [..]`` from ``before`` to now."""
    return f"load average {[round(x, 2) for x in before]} -> {[round(x, 2) for x in os.getloadavg()]}"


def parse_args(doc: str, results: Path) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=results)
    return ap.parse_args()


def alternate(
    cases: Sequence[tuple[str, Callable[[], float]]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every case once per repeat, in turn (slow drifts of a shared machine hit all alike); the runs and
    their medians by case name."""
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for name, run in cases:
            runs.setdefault(name, []).append(run())
    return runs, {k: statistics.median(v) for k, v in runs.items()}
