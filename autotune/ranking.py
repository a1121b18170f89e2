"""The ranking: every legal plan of a search space, estimated by the cost model, best first.

``plan_search`` enumerates the space (``space.py``) and estimates every legal plan, smallest micro-batch
first; once a plan does not fit, the larger micro-batches of its ladder are counted with it (memory grows with
the micro-batch) instead of estimated. A plan that does not fit is judged on its memory alone
(``rankworkers.judge``); only the closest miss is estimated in full, for the "fits nowhere" answer. Bad input
is a ``ConfigError`` that names the fix: no legal plan, a global batch no layout divides, or no plan that fits
(with the smallest cluster that would).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.batch import default_global_batch
from autotune.costmodel import Estimate, estimate
from autotune.enumeration import Variants
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM, headroom_reason
from autotune.plan import Framework, ParallelPlan
from autotune.rankworkers import judged_space
from autotune.space import (
    PlanContext,
    SearchSpace,
    Tally,
    batch_blocks_every_layout,
    enumerate_plans,
    layout_dps,
    resolve_choices,
    stored_fields,
    telling_reasons,
)
from autotune.specs import ClusterSpec, ModelSpec
from autotune.verdicts import Miss, rule_of

__all__ = ["ClusterAt", "Estimator", "LadderJudged", "Ranking", "plan_search", "rank_plans", "rule_of"]

Estimator = Callable[[ModelSpec, ClusterSpec, ParallelPlan], Estimate]
LadderJudged = Callable[[int, int], None]
"""Called as each micro-batch ladder is judged, with the plans the cost model estimated in it and how many of
them fit: a progress bar counts the ranking without wrapping the estimator, so the ranking still runs in
worker processes (``autotune.rankworkers`` only forks for the catalog cost model itself)."""
ClusterAt = Callable[[int], ClusterSpec]
"""Builds the same kind of cluster with another GPU count (for "the smallest cluster that fits")."""

_MAX_FIT_DOUBLINGS = 12


@dataclass(frozen=True, kw_only=True, slots=True)
class Ranking:
    """Every legal plan of a space, judged by the cost model."""

    ctx: PlanContext
    choices: dict[str, list[Any]]
    """Per knob, the values legal plans use: the study's categorical choices."""
    feasible: list[Estimate]
    """Best predicted tokens/s first."""
    pruned: dict[str, int]
    """Rule (illegal) or cost-model reason (infeasible) -> combinations, most first."""
    num_legal: int
    closest: Estimate | None
    """The infeasible legal plan that overcommits memory (GPU or host) the least."""


def rank_plans(
    choices: Mapping[str, tuple[Any, ...]],
    ctx: PlanContext,
    estimator: Estimator = estimate,
    *,
    first_fit: bool = False,
    on_ladder: LadderJudged | None = None,
    variants: Variants | None = None,
) -> Ranking:
    """Estimate every legal plan (stop at the first ladder or worker's part with a plan that fits with
    ``first_fit``, whose tallies then cover what was judged by then, only as far as fit or miss, less the
    variants dropped as holding states already found past the headroom: ``rankworkers.judge``'s
    ``fits_only``, ``rankworkers.StatesPast``); large spaces are enumerated and judged across worker processes
    (``autotune.rankworkers``), with the same result. ``on_ladder`` hears of each judged ladder
    (``LadderJudged``); ``variants``: made before from choices it ``serves`` (a caller that ranks a space
    on several clusters)."""
    tally, feasible = Tally(), []
    closest: Miss | None = None  # the least overcommitted miss
    judged = judged_space(choices, ctx, tally, estimator, variants, fits_only=first_fit)
    with contextlib.closing(judged):  # stopping early stops the workers now
        for part in judged:
            if on_ladder is not None:
                for estimated, fit in part.ladders:
                    on_ladder(estimated, fit)
            feasible += part.feasible
            tally.pruned.update(part.pruned)
            if part.closest is not None and (closest is None or part.closest[0] < closest[0]):
                closest = part.closest
            if first_fit and feasible:
                break
    feasible.sort(key=lambda e: e.tokens_per_s, reverse=True)
    return Ranking(
        ctx=ctx,
        choices=tally.choices(),
        feasible=feasible,
        num_legal=tally.num_legal,
        pruned=dict(sorted(tally.pruned.items(), key=lambda kv: (-kv[1], kv[0]))),  # ties: by name
        closest=_closest_estimate(closest, ctx, estimator),
    )


def _closest_estimate(closest: Miss | None, ctx: PlanContext, estimator: Estimator) -> Estimate | None:
    """The closest miss as an estimate: a plan judged on its memory alone is estimated now, once."""
    if closest is None:
        return None
    miss = closest[1]
    return miss if isinstance(miss, Estimate) else estimator(ctx.model, ctx.cluster, miss)


def plan_search(
    space: SearchSpace,
    model: ModelSpec,
    cluster: ClusterSpec,
    *,
    pins: Mapping[str, Any],
    global_batch: int | None,
    seq_len: int,
    estimator: Estimator = estimate,
    frameworks: Collection[Framework] | None = None,
    cluster_at: ClusterAt | None = None,
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
    routing: Mapping[str, Any] | None = None,
    stored: Mapping[str, Any] | None = None,
    on_ladder: LadderJudged | None = None,
) -> Ranking:
    """Rank the space for this model and cluster; ``ConfigError`` when no plan is legal and feasible.

    ``frameworks`` keeps only plans a backend can run; ``cluster_at`` lets "fits nowhere" name a cluster size;
    a plan above ``memory_headroom`` (``autotune/headroom.py``) is not recommended; ``routing`` (the user's
    ``moe_capacity_factor`` / ``moe_load_imbalance``: ``PlanContext.routing``) and ``stored`` (the user's
    ``weight_dtype`` / ``adam_dtype`` / ``loss_kernel``: ``PlanContext.stored``) are set on every plan;
    ``on_ladder`` hears of each judged ladder of the ranking (``LadderJudged``).
    """
    routing = dict(routing or {})
    if not model.is_moe and routing.get("moe_capacity_factor") is not None:
        raise ConfigError(f"--moe-capacity-factor: {model.name} is a dense model; drop the flag")
    if not model.is_moe and routing.get("moe_load_imbalance", 1.0) != 1.0:
        raise ConfigError(f"--moe-load-imbalance: {model.name} is a dense model; drop the flag")
    if frameworks is not None:
        space = _only_frameworks(space, model, cluster, pins, frameworks)
    choices, ctx = _context(space, model, cluster, pins, global_batch, seq_len)
    ctx = dataclasses.replace(ctx, memory_headroom=memory_headroom, **routing, **stored_fields(stored or {}))
    variants = Variants(choices)  # ~1M combinations for an MoE space: made once for the hint's rankings too
    ranking = rank_plans(choices, ctx, estimator, on_ladder=on_ladder, variants=variants)
    if ranking.feasible:
        return ranking
    if ranking.num_legal == 0 and batch_blocks_every_layout(choices, ctx):
        raise ConfigError(_batch_error(choices, ctx))
    if ranking.num_legal == 0:
        top = "; ".join(f"{n:,} {r}" for r, n in telling_reasons(ranking.pruned)[:3])
        raise ConfigError(f"no legal plan for {model.name} on {cluster.name} in {space.source}: {top}")
    raise ConfigError(_fits_nowhere(ranking, space, pins, global_batch, estimator, cluster_at, variants))


def _only_frameworks(
    space: SearchSpace,
    model: ModelSpec,
    cluster: ClusterSpec,
    pins: Mapping[str, Any],
    frameworks: Collection[Framework],
) -> SearchSpace:
    wanted = resolve_choices(space, model, cluster, pins)["framework"]
    kept = tuple(f for f in wanted if f in frameworks)
    if not kept:
        asked, runs = ", ".join(map(str, wanted)), ", ".join(sorted(map(str, frameworks)))
        raise ConfigError(
            f"framework {asked} cannot be measured here (this backend runs {runs}); "
            "use --backend simulate to plan it"
        )
    return dataclasses.replace(space, knobs={**space.knobs, "framework": kept})


def _context(
    space: SearchSpace,
    model: ModelSpec,
    cluster: ClusterSpec,
    pins: Mapping[str, Any],
    global_batch: int | None,
    seq_len: int,
) -> tuple[dict[str, tuple[Any, ...]], PlanContext]:
    choices = resolve_choices(space, model, cluster, pins)
    ctx = PlanContext(
        model=model, cluster=cluster, global_batch=global_batch or 1, seq_len=seq_len, dp=pins.get("dp")
    )
    if global_batch is None:  # ~4M tokens, a multiple of the smallest DP a legal layout has
        smallest_dp = min(layout_dps(choices, ctx), default=1)
        ctx = dataclasses.replace(ctx, global_batch=default_global_batch(seq_len, smallest_dp))
    return choices, ctx


def _batch_error(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext) -> str:
    dps = sorted(layout_dps(choices, ctx))
    gb = ctx.global_batch
    near = sorted(
        {d * k for d in dps for k in range(max(1, gb // d - 2), gb // d + 4)}, key=lambda x: (abs(x - gb), x)
    )
    fix = next(
        (x for x in near[:24] if any(enumerate_plans(choices, dataclasses.replace(ctx, global_batch=x)))),
        None,
    )
    hint = f"; try --global-batch {fix}" if fix else ""
    return (
        f"--global-batch {gb}: no DP x micro-batch of a legal layout divides it "
        f"(DP can be {', '.join(map(str, dps))}){hint}"
    )


def _fits_nowhere(
    ranking: Ranking,
    space: SearchSpace,
    pins: Mapping[str, Any],
    global_batch: int | None,
    estimator: Estimator,
    cluster_at: ClusterAt | None,
    variants: Variants,
) -> str:
    ctx, closest = ranking.ctx, ranking.closest
    cluster = ctx.cluster
    first = (
        (closest.reasons[0] if closest.reasons else headroom_reason(closest, ctx.memory_headroom))
        if closest
        else None
    )
    need = f" (the closest: {first})" if first else ""
    head = (
        f"{ctx.model.name} fits nowhere on {cluster.num_gpus} {cluster.gpu.key}: "
        f"every legal plan is infeasible{need}"
    )
    if cluster_at is None:
        return head
    n = cluster.num_gpus
    for _ in range(_MAX_FIT_DOUBLINGS):
        n *= 2
        try:
            choices, bigger = _context(space, ctx.model, cluster_at(n), pins, global_batch, ctx.seq_len)
        except ConfigError:
            continue
        bigger = dataclasses.replace(bigger, **ctx.routing(), **ctx.stored())
        same = variants if variants.serves(choices) else None
        if rank_plans(choices, bigger, estimator, first_fit=True, variants=same).feasible:
            return f"{head}; the cost model finds plans that fit on {n} GPUs: --gpus {n}"
    return f"{head}, even on {n} GPUs"
