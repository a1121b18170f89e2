"""Measured landscape: every legal plan of a (cut) space for ``tiny`` and ``small`` on 2 and 4 CPU ranks, with
the torchrun (FSDP2 / DTensor / pipelining) and the DeepSpeed backend, each plan measured ``--repeats`` times.

The space is the bundled ``fsdp`` / ``deepspeed`` space with these dimensions cut (``CUTS``), so that the
whole landscape measures in ~1.6 h on the 2-core machine:

* global batch fixed at 2 sequences per rank and seq-len at 64 (never tuned by autotune anyway);
* ``cp: [1]``: context parallelism is not implemented in real trials (the worker raises ``TrialError``);
* ``offload: [false]``: on a CPU device the "host" is the device, so optimizer offload moves nothing it can
  save, and DeepSpeed's offload path adds a CPU-Adam JIT build (~41 s, PLATFORM.md);
* ``recompute: [none]``: recompute trades time for memory, and memory is never short here (< 0.2 GiB of
  24 GiB), so every recompute plan is a slower twin of a measured one;
* ``schedule: [1f1b, interleaved]`` with ``virtual_stages: [2]`` (FSDP space; DeepSpeed runs 1F1B only):
  GPipe has 1F1B's bubble in every model compared here, and 4 virtual stages need 16 layers on PP 4.

Each plan runs through the trial worker's own ``run_trial`` (``_landscape_worker.py``) in its own torchrun
launch, as ``autotune search`` runs a trial (``_next_launch`` says why). Repeats run in passes (shuffled,
then reversed, again) so load drift does not favour a plan, and all of a cell's in one session: two more
repeats of the 2-rank cells measured 3 h after the first two read 0.92-1.47x them, median 1.04-1.16x per cell
(2026-12-01; runs/landscape/two-sessions). The 2-rank cells are measured with ``--repeats 4`` (a run costs
seconds there, and their held-out halves are 6-8 plans), the 4-rank cells with 2. tiny-2-torchrun, whose steps
are 35-370 ms, was measured again alone on 2026-12-03 with ``--repeats 8 --measure-steps 16``: at 4 x 8 its
repeats differed by 12-60 % per plan and the median of repeats 1-2 read 13 % (MAPE) from that of 3-4, which
no model fitted to it can beat; at 8 x 16 the halves read 5.9 % apart. That day the cell read 1.01-1.46x its
12-01 times (median 1.27x), unevenly over plans, so the cell is compared with a probe of the same day
(``probe_repeats/6``) as well as the committed one. tiny-4-torchrun was measured again on 12-03 too, with
``--repeats 3`` (3 whole passes, 174 runs in 46 min; a fourth pass did not fit the session): it read 0.92-2.0x
its 12-01 times (median 1.36x) and noisier (repeat 1 against 2: 15 % MAPE, 8.8 % on 12-01).
small-4-torchrun was measured again on 12-03 with ``--repeats 3`` and then ``--repeats 4`` (one more
pass, reversed; 240 runs in 98 min): it read 1.00-1.58x its 12-01 times (median 1.31x) and noisier (repeat 1
against 2: 13 % MAPE, 7 % on 12-01); the median of repeats 1-2 read 8.4 % from that of 3-4.
The torchrun cells were measured again, whole, after the trainer stopped reducing SP's norm gradients 3 times
per norm in AdamW (``trials.train.reduce_partial_grads``): TP + SP plans without DP read 0.73-0.90x their old
time (cell medians), the plans the change does not touch 0.85-1.00x (runs/landscape/before-sp-reduce).
Writes ``benchmarks/results/landscape_<model>_<n>rank_<backend>.jsonl`` (one line per plan: the plan, every
run with its load average, the median step time) and ``landscape_meta.json``.

Usage:  python benchmarks/landscape.py [--repeats 2] [--measure-steps 8] [--budget-min 45] [--cells ...]
        python benchmarks/landscape.py --cells tiny-2-torchrun --repeats 8 --measure-steps 16  (as committed)
        python benchmarks/landscape.py --cells small-4-torchrun --repeats 4  (as committed)
        (resumes from runs/landscape/*.raw.jsonl; ``--budget-min 0`` only rewrites the result files)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.plan import ParallelPlan, Recompute, Schedule  # noqa: E402
from autotune.probe.profile import with_profile  # noqa: E402
from autotune.ranking import Ranking, plan_search  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.trialrecord import plan_key  # noqa: E402
from autotune.trials.config import TrialConfig  # noqa: E402
from autotune.trials.cpu import cpu_share  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORK = ROOT / "runs" / "landscape"
SEQ_LEN = 64
SEQS_PER_RANK = 2
WARMUP_STEPS, MEASURE_STEPS = 2, 8
LAUNCH_OVERHEAD_S = 3.5
"""What a standalone trial adds to the in-process time: workers started (2.5-2.8 s) + tail (0.9 s),
benchmarks/results/trial_overhead.json. Used for trial-seconds in the search replay."""
CUTS: dict[str, tuple[Any, ...]] = {
    "cp": (1,),
    "offload": (False,),
    "recompute": (Recompute.NONE,),
    "schedule": (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED),
    "virtual_stages": (2,),
}
CELLS = tuple(f"{m}-{n}-{b}" for n in (2, 4) for b in ("torchrun", "deepspeed") for m in ("tiny", "small"))
"""Smallest cells first, so that a budget that runs out leaves whole cells measured."""


def cell_ranking(cell: str, pins: dict[str, Any] | None = None, profile: Path | None = None) -> Ranking:
    """Every legal plan of a cell's cut space (``pins`` narrow it), ranked by the uncalibrated cost model on
    the catalog ``cpu`` entry, or on a probe ``profile``."""
    model_name, nproc, backend = cell.split("-")
    n = int(nproc)
    space = load_space("fsdp" if backend == "torchrun" else "deepspeed")
    knobs = {k: v for k, v in space.knobs.items()}
    for knob, values in CUTS.items():
        if knob in knobs and not (knob == "schedule" and backend == "deepspeed"):
            knobs[knob] = values
    space = dataclasses.replace(space, knobs=knobs, source=f"{space.source} (landscape cuts)")
    cluster = make_cluster(num_gpus=n, gpu="cpu", gpus_per_node=n)
    if profile is not None:
        cluster = with_profile(cluster, profile)
    return plan_search(
        space,
        load_model(model_name),
        cluster,
        pins=pins or {},
        global_batch=SEQS_PER_RANK * n,
        seq_len=SEQ_LEN,
    )


def result_path(cell: str) -> Path:
    model, n, backend = cell.split("-")
    return RESULTS / f"landscape_{model}_{n}rank_{backend}.jsonl"


def load_landscape(cell: str) -> list[dict[str, Any]]:
    """The committed measurements of a cell: one dict per plan (``plan``, ``step_time_s``, ``runs``...)."""
    return [json.loads(line) for line in result_path(cell).read_text().splitlines() if line.strip()]


def replace_cells(out: Path, key: str, rows: list[dict[str, Any]], cells: list[str]) -> list[dict[str, Any]]:
    """``rows`` (of ``cells``) with the other cells' rows of the result file ``out`` (its list ``key``) kept,
    in ``CELLS`` order: a partial rerun after one cell was measured again."""
    old = json.loads(out.read_text())[key] if out.exists() else []
    kept = [r for r in old if r["cell"] not in cells]
    order = {c: i for i, c in enumerate(CELLS)}
    return sorted(kept + rows, key=lambda r: order.get(r["cell"], len(order)))  # stable sort


def _todo(
    cell: str, plans: list[ParallelPlan], repeats: int, done: set[tuple[str, int]], measure_steps: int
) -> list[dict]:
    model = load_model(cell.split("-")[0])
    config = TrialConfig(
        model=model, warmup_steps=WARMUP_STEPS, measure_steps=measure_steps, device="cpu"
    ).to_dict()
    order = list(range(len(plans)))
    random.Random(cell).shuffle(order)
    items = []
    for rep in range(repeats):
        for i in order if rep % 2 == 0 else order[::-1]:
            key = plan_key(plans[i])
            if (key, rep) not in done:
                items.append(
                    {
                        "key": key,
                        "repeat": rep,
                        "plan": plans[i].to_dict(),
                        "config": config,
                        "trial_dir": str(WORK / "trials" / cell / f"{i:04d}-r{rep}"),
                    }
                )
    return items


def _env(nproc: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = str(cpu_share(len(os.sched_getaffinity(0)), nproc)[0])  # as runner.py
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".torch_extensions"))
    return env


def _records(raw: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in raw.read_text().splitlines()] if raw.exists() else []


def _launch(cell: str, chunk: list[dict], raw: Path) -> None:
    nproc = int(cell.split("-")[1])
    todo = WORK / f"{cell}.todo.json"
    todo.write_text(json.dumps(chunk))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(ROOT / "benchmarks" / "_landscape_worker.py"),
        str(todo),
        str(raw),
    ]
    before = len(_records(raw))
    with (WORK / f"{cell}.stderr.log").open("ab") as log:
        try:
            subprocess.run(
                cmd,
                env=_env(nproc),
                stdout=log,
                stderr=log,
                timeout=120 + 45 * len(chunk),
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired:
            pass  # torchrun was killed; its workers die with it (PR_SET_PDEATHSIG in the trial worker)
    new = _records(raw)[before:]
    if len(new) == len(chunk) or any(r["status"] == "error" for r in new):
        return  # all done, or the worker recorded the plan that failed and stopped
    missing = chunk[len(new)]  # the plan running when the launch hung or crashed: an error, not retried
    with raw.open("a") as f:
        f.write(
            json.dumps(
                {
                    "key": missing["key"],
                    "repeat": missing["repeat"],
                    "status": "error",
                    "error": "no result (hang or crash; launch stopped)",
                    "load_avg": list(os.getloadavg()),
                    "time": time.time(),
                }
            )
            + "\n"
        )


def _next_launch(cell: str, todo: list[dict]) -> list[dict]:
    """The plans of the next launch: one, in every cell, as ``autotune search`` runs a trial (a subprocess
    per plan).

    torchrun cells: every trial builds a device mesh, and every mesh dimension a new gloo group (3 threads per
    rank each: ``gloo_tcp_loop`` and 2 ``pt_gloo_runloop``) that lives as long as the process; destroying them
    breaks DTensor, whose sharding cache holds the meshes (equal by layout) with their group names. Run one
    after another in one process, 4-rank trials slowed with every trial: 25 gloo threads per rank after 3
    trials, a TP2 x DP2 plan 203 ms then 220-267 ms after 1-8 more TP trials (2026-12-01, 2-core VM).

    DeepSpeed cells were measured in launches of up to 24 plans (its ZeRO engines reuse their groups), and
    read slow: small, DP 2, ZeRO-0 at 2 micro-batches 217 ms in such a launch, 168 ms as the only engine of
    its process; ZeRO-3 at 1 micro-batch 356 ms against 258-264 ms (2026-12-01, 2-core VM). DeepSpeed also
    keeps AutoTP / pipeline state in module globals after an engine is destroyed (the next ``initialize``
    fails on ``mpu.get_model_parallel_rank``). A launch per plan measures what a standalone trial measures."""
    return todo[:1]


def measure_cell(
    cell: str, repeats: int, deadline: float, measure_steps: int = MEASURE_STEPS
) -> dict[str, Any]:
    ranking = cell_ranking(cell)
    plans = [e.plan for e in ranking.feasible]
    raw = WORK / f"{cell}.raw.jsonl"
    while time.time() < deadline:
        todo = _todo(cell, plans, repeats, {(r["key"], r["repeat"]) for r in _records(raw)}, measure_steps)
        if not todo:
            break
        _launch(cell, _next_launch(cell, todo), raw)
    records = _records(raw)
    _write(cell, plans, records)
    loads = sorted(r["load_avg"][0] for r in records) or [math.nan]
    times = [r["time"] for r in records] or [math.nan]
    return {
        "cell": cell,
        "repeats": repeats,
        "measure_steps": measure_steps,
        "num_legal": ranking.num_legal,
        "num_plans": len(plans),
        "num_runs": len(records),
        "runs_ok": sum(r["status"] == "ok" for r in records),
        "first_run": _stamp(min(times)),
        "last_run": _stamp(max(times)),
        "measuring_s": max(times) - min(times),
        "load_avg_1min": {"min": loads[0], "median": statistics.median(loads), "max": loads[-1]},
    }


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t == t else "never"


def _write(cell: str, plans: list[ParallelPlan], records: list[dict[str, Any]]) -> None:
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_key.setdefault(r["key"], []).append(r)
    lines = []
    for plan in plans:
        runs = sorted(by_key.get(plan_key(plan), []), key=lambda r: r["repeat"])
        ok = [r for r in runs if r["status"] == "ok"]
        status = "ok" if ok and len(ok) == len(runs) else (runs[-1]["status"] if runs else "not_measured")
        step = statistics.median(r["step_time_s"] for r in ok) if ok else None
        wall = statistics.median(r["in_process_s"] for r in ok) + LAUNCH_OVERHEAD_S if ok else None
        lines.append(
            json.dumps(
                {
                    "key": plan_key(plan),
                    "plan": plan.to_dict(),
                    "status": status,
                    "step_time_s": step,
                    "trial_wall_s": wall,
                    "runs": runs,
                }
            )
        )
    result_path(cell).write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--budget-min", type=float, default=45.0, help="stop launching after this many minutes")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--measure-steps", type=int, default=MEASURE_STEPS, help="timed steps per run (median)")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadline = start + 60 * args.budget_min
    cells = [measure_cell(c, args.repeats, deadline, args.measure_steps) for c in args.cells.split(",")]
    import torch

    meta = {
        "cells": cells,
        "seq_len": SEQ_LEN,
        "seqs_per_rank": SEQS_PER_RANK,
        "warmup_steps": WARMUP_STEPS,
        "measure_steps": args.measure_steps,
        "plans_per_launch": 1,
        "launch_overhead_s": LAUNCH_OVERHEAD_S,
        "cuts": {k: [str(getattr(v, "value", v)) for v in vs] for k, vs in CUTS.items()},
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    meta_path = RESULTS / "landscape_meta.json"
    if meta_path.exists() and args.cells != ",".join(CELLS):  # a partial rerun keeps the other cells' rows
        old = json.loads(meta_path.read_text())  # older files kept repeats and steps once for every cell
        legacy = {"repeats": old.get("repeats", 2), "measure_steps": old.get("measure_steps", MEASURE_STEPS)}
        meta["cells"] = [
            c if c in cells else {**legacy, **c}
            for c in replace_cells(meta_path, "cells", cells, args.cells.split(","))
        ]
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    for c in cells:
        rows = load_landscape(c["cell"])
        ok = sum(r["status"] == "ok" for r in rows)
        print(f"{c['cell']}: {ok}/{len(rows)} plans ok; load {c['load_avg_1min']}")
    print(f"wall {(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
