"""Search efficiency replayed on the measured landscape: how many trials (and trial-seconds) each strategy
launches before it has measured a plan within 5 % of the landscape's best throughput.

Every "trial" returns the plan's committed landscape measurement (``benchmarks/results/landscape_*.jsonl``),
so a replay is cheap, repeatable and the same for every strategy. Strategies:

* ``autotune``: ``autotune.search.run_study`` itself, as ``autotune search`` runs it by default: the cost
  model's (catalog ``cpu`` entry) top 5 enqueued, then multivariate TPE gated by the cost model (seeded).
  ``autotune_recalibrate`` (``search --recalibrate``): the cost model picks the first plan, and after every
  trial ``calibrate.Refiner`` refits it to what was measured and enqueues its best untried plan;
  ``autotune_profile``: the default search ranked on the probe profile of the rank count
  (``--profile benchmarks/results/profiles/cpu-<N>rank.yaml``);
* ``tpe``: Optuna's multivariate TPE over the same knobs without the cost model (illegal combinations are
  rejected by the plan rules before launch, at no cost; seeded);
* ``random``: a uniformly random order of the legal plans (seeded);
* ``grid``: NeMo's order -- ``generate_grid_search_configs`` in NeMo's auto-configurator loops
  ``tp, pp, cp, ep, mbs`` outer to inner (ascending); the knobs NeMo lacks go innermost (``space.KNOBS``);
* ``deepspeed``: DeepSpeed Autotuning's order (``deepspeed/autotuning/autotuner.py``, fast mode, the
  default), on the space it covers (DeepSpeed, TP = PP = 1: ZeRO stage x micro-batch): a model-info run,
  then per stage 0..3 ``get_min_max_micro_batch_size`` (stage 0 starts at mbs 1, later stages at the previous
  stage's max), the max probe, ``get_tuning_micro_batch_size_list`` and the same-gas refinement. The global
  batch is fixed here, so ``max_train_batch_size`` = it and ``max_train_micro_batch_size_per_gpu`` = the
  per-rank batch; candidates that do not divide the per-rank batch are outside the space and cost nothing, an
  experiment DeepSpeed already ran is cached (its scheduler skips it). All strategies also run on that
  subspace.

Usage:  python benchmarks/search_replay.py [--seeds 20] [--profiles DIR] [--out FILE] [--cells A,B]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from autotune.calibrate import Refiner  # noqa: E402
from autotune.ranking import Ranking  # noqa: E402
from autotune.search import StudyOptions, make_sampler, run_study  # noqa: E402
from autotune.space import KNOBS, suggest_plan  # noqa: E402
from autotune.trials.request import TrialRequest  # noqa: E402
from autotune.trials.result import TrialResult, TrialStatus  # noqa: E402
from benchmarks.landscape import (  # noqa: E402
    CELLS,
    RESULTS,
    cell_ranking,
    load_landscape,
    plan_key,
    replace_cells,
    result_path,
)

PROFILES = RESULTS / "profiles"
WITHIN = 0.05
TOP_K = 5


class _Found(Exception):
    """A plan within 5 % of the best was measured: the replay of this strategy stops."""


class Landscape:
    """The measured plans of one cell (or its DeepSpeed-covered subspace) and the replay bookkeeping."""

    def __init__(self, rows: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool] = lambda p: True):
        self.rows = {r["key"]: r for r in rows if keep(r["plan"]) and r["status"] != "not_measured"}
        ok = [r["step_time_s"] for r in self.rows.values() if r["status"] == "ok"]
        self.best_s = min(ok)
        self.wall_s = statistics.median(r["trial_wall_s"] for r in self.rows.values() if r["trial_wall_s"])

    def good(self, key: str) -> bool:
        row = self.rows.get(key)
        return bool(row and row["status"] == "ok" and self.best_s / row["step_time_s"] >= 1 - WITHIN)


class Replay:
    """One strategy's run: every launch is counted with its trial-seconds; raises ``_Found`` when done."""

    def __init__(self, land: Landscape) -> None:
        self.land, self.trials, self.seconds, self.seen = land, 0, 0.0, set()

    def launch(self, key: str) -> TrialResult:
        row = self.land.rows.get(key)
        if row is None:  # not in the measured landscape (budget): neither counted nor found
            return TrialResult(status=TrialStatus.ERROR, error="not measured", wall_s=0.0)
        if key not in self.seen:
            self.seen.add(key)
            self.trials += 1
            self.seconds += row["trial_wall_s"] or self.land.wall_s
        if self.land.good(key):
            raise _Found
        if row["status"] != "ok":
            return TrialResult(status=TrialStatus.ERROR, error=row["status"], wall_s=0.0)
        tokens = row["plan"]["global_batch"] * row["plan"]["seq_len"]
        return TrialResult(
            status=TrialStatus.OK,
            tokens_per_s=tokens / row["step_time_s"],
            step_time_s=row["step_time_s"],
            wall_s=0.0,
        )

    def result(self) -> tuple[int, float]:
        return self.trials, self.seconds


class _Backend:
    name, measures = "replay", True

    def __init__(self, replay: Replay) -> None:
        self.replay = replay

    def run(self, request: TrialRequest, report: Any = None) -> TrialResult:
        return self.replay.launch(plan_key(request.plan))


def _until_found(replay: Replay, order: Iterator[str]) -> tuple[float, float]:
    try:
        for key in order:
            if key in replay.land.rows:
                replay.launch(key)
    except _Found:
        return replay.result()
    return math.inf, math.inf


def run_autotune(
    ranking: Ranking, land: Landscape, seed: int, refiner: Refiner | None
) -> tuple[float, float]:
    """``autotune search`` as it runs trials: ``run_study`` with the online recalibration (``refiner``), or
    without it (the cost model's top 5, then TPE) when ``refiner`` is None."""
    replay = Replay(land)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(seed))
    options = StudyOptions(n_trials=len(land.rows), top_k=TOP_K)
    try:
        run_study(study, ranking, _Backend(replay), options, trials_dir=Path("/nonexistent"), refine=refiner)
    except _Found:
        return replay.result()
    return math.inf, math.inf


def _tpe_order(ranking: Ranking, land: Landscape, seed: int) -> Iterator[str]:
    study = optuna.create_study(direction="maximize", sampler=make_sampler(seed))
    tried: dict[str, float | None] = {}
    for _ in range(50 * len(land.rows)):
        if len(tried) >= len(land.rows):
            return
        trial = study.ask()
        plan, _reason = suggest_plan(trial, ranking.choices, ranking.ctx)
        key = plan_key(plan) if plan is not None else None
        if key is None or key not in land.rows:
            study.tell(trial, state=TrialState.FAIL)
            continue
        if key not in tried:
            yield key  # launched; the generator's consumer raises _Found when it is good
            row = land.rows[key]
            tried[key] = (
                row["plan"]["global_batch"] * row["plan"]["seq_len"] / row["step_time_s"]
                if row["status"] == "ok"
                else None
            )
        value = tried[key]
        study.tell(trial, value) if value is not None else study.tell(trial, state=TrialState.FAIL)


def run_tpe(ranking: Ranking, land: Landscape, seed: int) -> tuple[float, float]:
    return _until_found(Replay(land), _tpe_order(ranking, land, seed))


def run_random(land: Landscape, seed: int) -> tuple[float, float]:
    keys = sorted(land.rows)
    random.Random(seed).shuffle(keys)
    return _until_found(Replay(land), iter(keys))


def grid_order(land: Landscape) -> list[str]:
    """NeMo: tp, pp, cp, (ep), mbs outer to inner, ascending; the other knobs innermost."""
    lead = ("tp", "pp", "cp", "micro_batch")
    rest = [k for k in KNOBS if k not in lead]

    def sort_key(key: str) -> tuple:
        params = json.loads(key)
        return tuple(params[k] for k in lead) + tuple(str(params[k]) for k in rest)

    return sorted(land.rows, key=sort_key)


def deepspeed_order(land: Landscape) -> list[tuple[str, str | None]]:
    """DeepSpeed Autotuning's experiments (fast mode), as ``(name, plan key)``: the key is None for an
    experiment outside the fixed-batch space (its model-info run, and its min/max probes, which run at the
    user's accumulation steps, 1, so at another global batch) -- a trial that finds nothing."""
    stage_sharding = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}
    sample = json.loads(next(iter(land.rows)))
    per_rank = next(r["plan"]["global_batch"] // r["plan"]["dp"] for r in land.rows.values())
    order: list[tuple[str, str | None]] = [("profile_model_info", None)]

    def exp(stage: int, mbs: int, gas: int) -> None:
        name = f"z{stage}_gas{gas}_tmbspg{mbs}"
        if any(n == name for n, _ in order):
            return  # the scheduler skips an experiment it already ran
        in_space = mbs * gas == per_rank
        key = json.dumps(sample | {"sharding": stage_sharding[stage], "micro_batch": mbs}, sort_keys=True)
        order.append((name, key if in_space else None))

    prev_max = 0
    for stage in range(4):
        low = 1 if prev_max < 1 else prev_max  # get_min_max_micro_batch_size: the min probe (gas 1)
        exp(stage, low, 1)
        high = per_rank  # max_train_micro_batch_size_per_gpu = the per-rank batch: the first max probe runs
        exp(stage, high, 1)
        lo = high // 2 if low < high // 2 else low  # get_tuning_micro_batch_size_list
        stride = max(1, (high - lo) // 3)
        tune = [m for m in range(lo, high, stride) if per_rank // m != per_rank // high] + [high]
        for m in tune:  # run_tuning_micro_batch_sizes: gas = max_train_batch_size_per_gpu // mbs
            exp(stage, m, per_rank // m)
        same_gas_lo = tune[-2] + 1 if len(tune) > 1 else low
        for m in reversed(range(same_gas_lo, high, max(1, (high - same_gas_lo) // 3))):
            exp(stage, m, per_rank // m)
            break  # it stops at the first mbs that is not 5 % faster; one at least is tried
        prev_max = high
    return order


def run_deepspeed(land: Landscape) -> tuple[float, float]:
    replay = Replay(land)
    try:
        for _name, key in deepspeed_order(land):
            if key is None or key not in land.rows:
                replay.trials += 1
                replay.seconds += land.wall_s
            else:
                replay.launch(key)
    except _Found:
        return replay.result()
    return math.inf, math.inf


def _summary(values: list[tuple[float, float]]) -> dict[str, Any]:
    trials = [t for t, _ in values]
    secs = [s for _, s in values]
    return {
        "median_trials": statistics.median(trials),
        "mean_trials": statistics.fmean(trials),
        "max_trials": max(trials),
        "median_trial_s": statistics.median(secs),
        "runs": len(values),
        "trials": trials,
    }


def _ds_keep(plan: dict[str, Any]) -> bool:
    return plan["framework"] == "deepspeed" and plan["tp"] == 1 and plan["pp"] == 1


def replay_cell(cell: str, seeds: int, subspace: bool, profiles: Path = PROFILES) -> dict[str, Any] | None:
    # the subspace is what `autotune search --tp 1 --pp 1 --framework deepspeed` ranks
    if not result_path(cell).exists():
        return None
    ranking = cell_ranking(cell, {"tp": 1, "pp": 1} if subspace else None)
    rows = load_landscape(cell)
    if not any(r["status"] == "ok" for r in rows):
        return None
    land = Landscape(rows, _ds_keep if subspace else lambda p: True)
    refiner = Refiner(ranking)  # shared by the seeds: fits are cached by what was measured
    profile = profiles / f"cpu-{cell.split('-')[1]}rank.yaml"
    pins = {"tp": 1, "pp": 1} if subspace else None
    profiled = cell_ranking(cell, pins, profile) if profile.exists() else None
    out = {
        "cell": cell,
        "space": "deepspeed-covered" if subspace else "full",
        "num_plans": len(land.rows),
        "num_good": sum(land.good(k) for k in land.rows),
        "best_step_s": land.best_s,
        "autotune": _summary([run_autotune(ranking, land, s, None) for s in range(seeds)]),
        "autotune_recalibrate": _summary([run_autotune(ranking, land, s, refiner) for s in range(seeds)]),
        "autotune_profile": _summary([run_autotune(profiled, land, s, None) for s in range(seeds)])
        if profiled
        else None,
        "tpe": _summary([run_tpe(ranking, land, s) for s in range(seeds)]),
        "random": _summary([run_random(land, s) for s in range(seeds)]),
        "grid": _summary([_until_found(Replay(land), iter(grid_order(land)))]),
    }
    if subspace:
        out["deepspeed"] = _summary([run_deepspeed(land)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS / "search_replay.json")
    ap.add_argument(
        "--profiles",
        type=Path,
        default=PROFILES,
        help="directory of the probe profiles cpu-<N>rank.yaml (autotune_profile)",
    )
    ap.add_argument(
        "--cells",
        default=",".join(CELLS),
        help="only these (comma-separated); the other cells' rows of --out are kept",
    )
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    only = args.cells.split(",")
    if unknown := sorted(set(only) - set(CELLS)):
        ap.error(f"--cells: unknown cell {unknown[0]!r}; cells: {', '.join(CELLS)}")
    results = []
    for cell in only:
        for subspace in (False, True) if cell.endswith("deepspeed") else (False,):
            res = replay_cell(cell, args.seeds, subspace, args.profiles)
            if res:
                results.append(res)
                print(
                    cell,
                    res["space"],
                    {
                        k: res[k]["median_trials"]
                        for k in (
                            "autotune",
                            "autotune_profile",
                            "autotune_recalibrate",
                            "tpe",
                            "random",
                            "grid",
                            "deepspeed",
                        )
                        if res.get(k)
                    },
                )
    if only != list(CELLS):
        results = replace_cells(args.out, "cells", results, only)
    args.out.write_text(
        json.dumps(
            {
                "within": WITHIN,
                "seeds": args.seeds,
                "top_k": TOP_K,
                "profiles": str(args.profiles),
                "cells": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
