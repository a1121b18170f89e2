"""Fidelity of the cost model on the measured landscape, before and after calibration, in-sample and held out.

For every landscape cell (model x ranks x backend) with measured plans: the measured step time of a plan is
the median of its repeats. The plans are split in half at random (seeded); ``autotune.calibrate.fit`` is
fitted on one half and Kendall tau and MAPE are reported on that half and on the held-out half, against the
model before calibration (catalog ``cpu`` entry, and the probe profile when one exists for the rank count).
The measurement's own ceiling is reported beside them: tau and MAPE of repeat 1 against repeat 2 of the
same plans, with 4 or 8 repeats the median of the first half of them against that of the second (no model
can rank plans better than the measurement ranks itself). The same is done on the H200 trials of
benchmarks/results/gpu_validate.json (``gpu_cells``).

The held-out half of a cell is 6-15 plans, so one split's tau and MAPE move with the split: every cell is also
split ``--splits`` times (seeds 0..N-1) and the median and range of the held-out numbers reported
(``held_out_splits``).

The probe is noisy on this VM, so the probe-profile rows are also computed from repeated probes
(``--profiles benchmarks/results/probe_repeats/N --out FILE``; only the profile rows are written then, as the
catalog rows do not depend on a profile).

Usage:  python benchmarks/fidelity.py [--seed 0] [--splits 10] [--profiles DIR --out FILE] [--cells A,B]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.calibrate import Observation, fidelity, fit, kendall_tau  # noqa: E402
from autotune.catalog import make_cluster  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402
from benchmarks.landscape import (  # noqa: E402
    CELLS,
    RESULTS,
    ROOT,
    cell_ranking,
    load_landscape,
    replace_cells,
    result_path,
)

PROFILES = RESULTS / "profiles"


def _observations(rows: list[dict[str, Any]]) -> list[Observation]:
    return [
        Observation(plan=ParallelPlan.from_dict(r["plan"]), measured_s=r["step_time_s"], label=r["key"])
        for r in rows
        if r["status"] == "ok" and r["step_time_s"]
    ]


def repeat_ceiling(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """tau and MAPE of one measurement of the plans against another: the median of the first half of each
    plan's repeats against that of the second (repeat 1 against 2; with 4, repeats 1-2 against 3-4)."""
    pairs = [
        _halves([run["step_time_s"] for run in r["runs"]])
        for r in rows
        if r["status"] == "ok" and len(r["runs"]) >= 2
    ]
    if len(pairs) < 2:
        return {"kendall_tau": None, "mape": None, "num_plans": len(pairs)}
    a, b = zip(*pairs, strict=True)
    return {
        "kendall_tau": kendall_tau(a, b),
        "mape": statistics.fmean(abs(x - y) / y for x, y in pairs),
        "num_plans": len(pairs),
    }


def _halves(times: list[float]) -> tuple[float, float]:
    """The median of the first half of the repeats and that of the second (an odd last repeat left out)."""
    half = len(times) // 2
    return statistics.median(times[:half]), statistics.median(times[half : 2 * half])


def evaluate(cell: str, seed: int, profile: Path | None) -> dict[str, Any] | None:
    obs = _observations(load_landscape(cell))
    if len(obs) < 8:
        return None
    ranking = cell_ranking(cell, profile=profile)
    model, cluster = ranking.ctx.model, ranking.ctx.cluster
    shuffled = list(obs)
    random.Random(seed).shuffle(shuffled)
    half = len(shuffled) // 2
    train, test = shuffled[:half], shuffled[half:]
    result = fit(model, cluster, train)
    calibrated = result.factors.apply(cluster)
    everything = fit(model, cluster, obs)
    return {
        "cell": cell,
        "base": profile.name if profile else "catalog cpu",
        "num_plans": len(obs),
        "num_fit": len(train),
        "num_held_out": len(test),
        "before_all": fidelity(model, cluster, obs).as_dict(),
        "after_fit_half": result.after.as_dict(),
        "before_held_out": fidelity(model, cluster, test).as_dict(),
        "after_held_out": fidelity(model, calibrated, test).as_dict(),
        "after_all_fit_all": everything.after.as_dict(),
        "factors": result.factors.as_dict(),
        "fitted": list(result.fitted),
        "unidentified": list(result.unidentified),
    }


def held_out_splits(cell: str, splits: int, profile: Path | None) -> dict[str, Any]:
    """Held-out tau and MAPE after calibration over ``splits`` random halvings: median, min, max."""
    runs = [evaluate(cell, seed, profile) for seed in range(splits)]
    held = [r["after_held_out"] for r in runs if r]
    taus = [h["kendall_tau"] for h in held if h["kendall_tau"] is not None]
    mapes = [h["mape"] for h in held]
    return {
        "splits": splits,
        "kendall_tau": {"median": statistics.median(taus), "min": min(taus), "max": max(taus)},
        "mape": {"median": statistics.median(mapes), "min": min(mapes), "max": max(mapes)},
    }


def gpu_cells(seed: int) -> list[dict[str, Any]]:
    """The same split-half fit on the H200 trials of benchmarks/results/gpu_validate.json (a 1B Llama at world
    size 1; FSDP at world size 1 is planned as no sharding, so each FSDP setting is its own cell)."""
    data = json.loads((RESULTS / "gpu_validate.json").read_text())
    model = ModelSpec(**{k: v for k, v in data["model"].items() if k != "num_params"})
    cluster = make_cluster(num_gpus=1, gpu=data["gpu_catalog"])
    out = []
    for fsdp in ("none", "fsdp-full"):
        obs = [
            Observation(
                plan=ParallelPlan(
                    micro_batch=r["micro_batch"],
                    global_batch=r["micro_batch"],
                    seq_len=data["seq_len"],
                    recompute=r["recompute"],
                ),
                measured_s=r["step_time_s"],
                label=r["config"],
            )
            for r in data["results"]
            if r["status"] == "ok" and r["fsdp"] == fsdp
        ]
        shuffled = list(obs)
        random.Random(seed).shuffle(shuffled)
        train, test = shuffled[: len(obs) // 2], shuffled[len(obs) // 2 :]
        result = fit(model, cluster, train)
        out.append(
            {
                "cell": f"h200 llama-1b, FSDP {fsdp} (gpu_validate)",
                "base": f"catalog {cluster.gpu.key}",
                "num_plans": len(obs),
                "num_fit": len(train),
                "num_held_out": len(test),
                "before_all": fidelity(model, cluster, obs).as_dict(),
                "after_fit_half": result.after.as_dict(),
                "before_held_out": fidelity(model, cluster, test).as_dict(),
                "after_held_out": fidelity(model, result.factors.apply(cluster), test).as_dict(),
                "after_all_fit_all": fit(model, cluster, obs).after.as_dict(),
                "factors": result.factors.as_dict(),
                "fitted": list(result.fitted),
                "unidentified": list(result.unidentified),
                "repeat_ceiling": {"kendall_tau": None, "mape": None, "num_plans": 0},
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--splits", type=int, default=10, help="random halvings for the held-out median")
    ap.add_argument("--profiles", type=Path, default=PROFILES, help="where cpu-<N>rank.yaml are")
    ap.add_argument("--out", type=Path, default=RESULTS / "fidelity.json")
    ap.add_argument(
        "--cells",
        default=",".join(CELLS),
        help="only these (comma-separated); the other cells' rows of --out are kept",
    )
    args = ap.parse_args()
    repeat = args.profiles.resolve() != PROFILES.resolve()
    only = args.cells.split(",")
    if unknown := sorted(set(only) - set(CELLS)):
        ap.error(f"--cells: unknown cell {unknown[0]!r}; cells: {', '.join(CELLS)}")
    cells = []
    for cell in only:
        if not result_path(cell).exists():
            continue
        rows = load_landscape(cell)
        n = cell.split("-")[1]
        profile = args.profiles / f"cpu-{n}rank.yaml"
        for base in ([] if repeat else [None]) + ([profile] if profile.exists() else []):
            res = evaluate(cell, args.seed, base)
            if res is None:
                continue
            res["repeat_ceiling"] = repeat_ceiling(rows)
            res["held_out_splits"] = held_out_splits(cell, args.splits, base)
            cells.append(res)
            print(
                cell,
                res["base"],
                {
                    k: (round(res[k]["kendall_tau"] or 0, 2), round(res[k]["mape"], 2))
                    for k in ("before_held_out", "after_held_out", "after_all_fit_all")
                },
            )
    if only != list(CELLS):
        cells = replace_cells(args.out, "cells", cells, only)
    elif not repeat:
        cells += gpu_cells(args.seed)
    profiles = str(args.profiles.resolve().relative_to(ROOT))
    out = {"seed": args.seed, "splits": args.splits, "profiles": profiles, "cells": cells}
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
