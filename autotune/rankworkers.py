"""Judging a space's micro-batch ladders, in this process or across forked workers: same verdicts, sooner.

A ladder's plans are estimated smallest micro-batch first until one does not fit (``ranking.rank_plans``).
Ladders are independent of each other, and the cost model is all of a search's planning time: Llama 3.1
405B on 16,384 GPUs is ~45,000 estimates, an MoE model on 16 GPUs ~80,000 (benchmarks/search_speed.py).
With the catalog cost model and a space of at least ``MIN_LADDERS`` ladders, ``workers()`` forked
processes (they inherit the model, cluster and the space's variants) each enumerate and judge parts of
layouts (``layout_ladders``), so the enumeration runs in parallel too and no ladder travels; they send back
what the ranking keeps (``verdicts.Kept``: the plans that fit, the misses counted by rule, the closest
miss), not every plan's verdict, and the parts are merged in enumeration order, so the ranking is the one a
single process makes. A ranking that stops at its first fit (the "fits nowhere" hint) stops the workers
there. Elsewhere (a caller's own estimator, which may keep state; one CPU; not Linux, whose ``fork`` the
workers need; inside a daemonic process) the ladders are judged here, one after the other.
``AUTOTUNE_PLAN_WORKERS=1`` forces that.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import operator
import os
import signal
import sys
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from autotune.costmodel import Estimate, estimate, fit_check
from autotune.costmodel.reserve import FRAGMENTATION_FRACTION
from autotune.costmodel.stagestates import NOT_READ, states_floor_bytes
from autotune.enumeration import (
    Ladder,
    Layout,
    Tally,
    Variant,
    Variants,
    enumerate_plans,
    layout_candidates,
    layout_ladders,
    layouts,
)
from autotune.errors import ConfigError
from autotune.headroom import headroom_reason, peak_headroom_reason
from autotune.legality import check_plan
from autotune.plan import ParallelPlan
from autotune.specs import GIB
from autotune.verdicts import Kept, Verdict, kept, overcommit

if TYPE_CHECKING:
    from autotune.space import PlanContext

__all__ = [
    "MIN_LADDERS",
    "judge",
    "judged_here",
    "judged_space",
    "workers",
]

MIN_LADDERS = 2000
"""Below this many ladders (a few seconds of estimates at most) starting workers is not worth it."""
_CHUNKS_PER_WORKER = 16
"""A space is handed out in about this many parts per worker: big enough to amortise the messages, small
enough that a worker that drew the expensive ladders does not leave the others idle, and that a ranking
which stops at its first fit judges little past it."""


def judge(
    ladder: Ladder,
    ctx: PlanContext,
    estimator: Callable[..., Estimate] = estimate,
    *,
    fits_only: bool = False,
    closest: float = math.inf,
    past: StatesPast | None = None,
) -> list[Verdict]:
    """A ladder's verdicts, smallest micro-batch first, up to the first that does not fit. With the catalog
    cost model a plan's memory is judged first and its step time is priced only if it fits (most plans of
    a large MoE space do not: benchmarks/results/search_speed.md), and before its memory its model states
    (``states_floor_bytes``, a lower bound of the total, computed once for both). A plan they alone overfill
    is a miss without the rest of its memory, and its verdict has no ``overcommit``: with ``fits_only`` (a
    caller that asks only whether a plan fits, with no tally or closest miss to show) past the headroom;
    otherwise when it is surely out of memory (``_surely_out_of_memory``) and misses by more than
    ``closest``, the least ``overcommit`` of a miss the caller has seen, so it cannot be the closest.
    ``past`` (with ``fits_only``) learns each ladder whose first plan's states alone pass the headroom."""
    out: list[Verdict] = []
    n = len(ladder.micro_batches)
    for i, micro_batch in enumerate(ladder.micro_batches):
        try:
            plan = ladder.plan(micro_batch)
        except ConfigError as e:  # a plan.py rule space.py does not mirror yet: counted, never fatal
            out.append(Verdict(None, str(e), n - i))
            break
        if estimator is estimate:
            floor, capacity = states_floor_bytes(ctx.model, ctx.cluster, plan), ctx.cluster.gpu.memory_bytes
            above = peak_headroom_reason(floor, capacity, ctx.memory_headroom) if fits_only else None
            if above is not None:  # the total holds the floor: above the headroom, if not out of memory
                out.append(Verdict(None, f"{above} (model states alone)", n - i, plan))
                if past is not None and i == 0:
                    past.add(ladder)
                break
            if not fits_only and floor > closest * capacity and _surely_out_of_memory(floor, plan, ctx):
                oom = f"out of memory: model states alone need {floor / GIB:.1f} GiB"
                out.append(Verdict(None, oom, n - i, plan))
                break
            memory, reasons = checked = fit_check(ctx.model, ctx.cluster, plan)
            room = peak_headroom_reason(memory.total_bytes, capacity, ctx.memory_headroom)
            miss = reasons[0] if reasons else room
            if miss is not None:
                out.append(Verdict(None, miss, n - i, plan, overcommit(memory, ctx.cluster)))
                break
            out.append(Verdict(estimate(ctx.model, ctx.cluster, plan, checked=checked)))
            continue
        est = estimator(ctx.model, ctx.cluster, plan)
        above = headroom_reason(est, ctx.memory_headroom) if est.feasible else None
        if est.feasible and above is None:
            out.append(Verdict(est))
            continue
        out.append(Verdict(est, above or est.reasons[0], n - i))  # larger ones cannot fit
        break
    return out


class StatesPast:
    """The model states a ``fits_only`` ranking found past the headroom, so that the enumeration drops the
    variants that hold the same ones (``enumeration.Skip``) before their rules and plans are made. A
    variant's states floor (``states_floor_bytes``) reads its layout, its ``num_microbatches`` (here: its
    first micro-batch; the rest of the ranking's context is fixed) and the fields ``stage_states`` reads,
    not ``NOT_READ``, which ``reserve_bytes`` and ``ranks_to_check`` do not read either. Variants that differ
    in those fields only (recompute, sequence parallelism, the speed switches) are most of an MoE space:
    DeepSeek-V3 on 32 A100-40GB, where nothing fits, judges 112k plans instead of 775k
    (benchmarks/results/fits_nowhere_speed.md)."""

    _READ = tuple(f for f in Variant._fields if f not in NOT_READ)
    _of_variant = operator.attrgetter(*_READ)
    _of_fields = operator.itemgetter("tp", "pp", "cp", "dp", *_READ)

    def __init__(self) -> None:
        self._keys: set[tuple[Any, ...]] = set()

    def add(self, ladder: Ladder) -> None:
        self._keys.add((ladder.micro_batches[0], *self._of_fields(ladder.fields)))

    def skip(self, layout: tuple[int, int, int, int], micro_batch: int, v: Variant) -> bool:
        return (micro_batch, *layout, *self._of_variant(v)) in self._keys


def _surely_out_of_memory(floor: float, plan: ParallelPlan, ctx: PlanContext) -> bool:
    """Whether ``fit_check``'s first reason for ``plan`` is "out of memory", from its model-states floor:
    no rule of ``check_plan`` fails, and the floor is past the device even after the allocator's slack.
    ``needed_bytes`` of the worst stage is its total less ``FRAGMENTATION_FRACTION`` of its transient
    bytes, so at least ``total / (1 + FRAGMENTATION_FRACTION)``; the worst stage's total holds the floor."""
    capacity = ctx.cluster.gpu.memory_bytes
    if floor <= capacity * (1.0 + FRAGMENTATION_FRACTION):
        return False
    return not check_plan(plan, ctx.model, ctx.cluster)


def workers() -> int:
    """Processes to judge ladders with: ``AUTOTUNE_PLAN_WORKERS``, else the CPUs this process may use."""
    env = os.environ.get("AUTOTUNE_PLAN_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def judged_space(
    choices: Mapping[str, tuple[Any, ...]],
    ctx: PlanContext,
    tally: Tally,
    estimator: Callable[..., Estimate] = estimate,
    variants: Variants | None = None,
    *,
    fits_only: bool = False,
) -> Generator[Kept, None, None]:
    """``judge`` of every ladder of ``choices`` (``enumerate_plans``, which counts what it prunes in
    ``tally``), in its order, as the ranking keeps them (``kept``; the misses are counted in each
    ``Kept.pruned``): one ``Kept`` per ladder judged here, or per part a worker enumerated and judged; the
    workers' tallies are merged here, in order, as their parts arrive. ``fits_only``: ``judge``'s, for a
    caller that stops at the first plan that fits (closing the generator drops the parts not yet judged),
    which then drops the variants whose states it found past the headroom (``StatesPast``), uncounted.
    ``variants``: made before (``Variants.serves``)."""
    global _SPACE, _CLOSEST, _PAST
    variants = variants if variants is not None else Variants(choices)
    order, n = layouts(choices, ctx), workers()
    forks = _forks(estimator, n)
    sizes = [layout_candidates(variants, ctx, layout) for layout in order] if forks else []  # before forking
    past = StatesPast() if fits_only and estimator is estimate else None
    skip = past.skip if past is not None else None
    if not forks or sum(sizes) < MIN_LADDERS:
        ladders = enumerate_plans(choices, ctx, tally, variants, skip)
        for verdicts in judged_here(ladders, ctx, estimator, fits_only, past):
            yield kept([verdicts], ctx)
        return
    step = max(1, sum(sizes) // (n * _CHUNKS_PER_WORKER))
    parts = [
        (layout, (a, a + step))
        for layout, size in zip(order, sizes, strict=True)
        for a in range(0, max(size, 1), step)
    ]
    _SPACE, _CLOSEST, _PAST = (variants, ctx, estimator, fits_only), math.inf, past  # each worker's own copy
    done = 0
    pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"), initializer=_quiet)
    try:
        for part_tally, part_kept in pool.map(_judge_part, parts):
            tally.merge(part_tally)
            done += 1
            yield part_kept
    except BrokenProcessPool:  # a worker died (killed, out of memory): judge the rest here
        rest = (
            ladder
            for layout, part in parts[done:]
            for ladder in layout_ladders(variants, ctx, layout, tally, part, skip=skip)
        )
        for verdicts in judged_here(rest, ctx, estimator, fits_only, past):
            yield kept([verdicts], ctx)
    finally:  # also when the caller stops early or a stop signal comes: queued parts are dropped
        pool.shutdown(wait=True, cancel_futures=True)
        _SPACE, _PAST = None, None


def _forks(estimator: Callable[..., Estimate], n: int) -> bool:
    """Whether ladders may be judged by ``n`` forked workers: the catalog cost model, several CPUs, Linux."""
    return (
        estimator is estimate
        and n > 1
        and sys.platform.startswith("linux")  # fork is not safe with macOS system libraries
        and "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    )


def _quiet() -> None:
    """A worker leaves stop signals to the parent (which stops the pool) and dies at once on SIGTERM: the
    parent's handlers (``autotune.interrupt``) are not inherited. What it inherited is frozen out of its
    garbage collector, so no finalizer of the parent's objects (a study's database connection, when
    ``autotune worker`` ranks) runs in the worker; workers end with ``os._exit``, without atexit handlers."""
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def judged_here(
    ladders: Iterable[Ladder],
    ctx: PlanContext,
    estimator: Callable[..., Estimate],
    fits_only: bool,
    past: StatesPast | None = None,
) -> Generator[list[Verdict], None, None]:
    """``judge`` of each ladder in this process, telling it the closest miss so far."""
    closest = math.inf
    for ladder in ladders:
        verdicts = judge(ladder, ctx, estimator, fits_only=fits_only, closest=closest, past=past)
        closest = _closer(closest, verdicts)
        yield verdicts


def _closer(closest: float, verdicts: list[Verdict]) -> float:
    """The least ``overcommit`` of a miss seen, after ``verdicts`` (what ``judge``'s ``closest`` takes)."""
    return min([closest, *(v.overcommit for v in verdicts if v.overcommit is not None)])


_CLOSEST = math.inf
"""In a worker: the least ``overcommit`` of a miss it has judged (``judge``'s ``closest``)."""


_SPACE: tuple[Variants, PlanContext, Callable[..., Estimate], bool] | None = None
"""What forked workers enumerate and judge (``judged_space``; set in the parent before the fork)."""
_PAST: StatesPast | None = None
"""In a worker of a ``fits_only`` ranking: the states it found past the headroom (``StatesPast``)."""


def _judge_part(part: tuple[Layout, tuple[int, int]]) -> tuple[Tally, Kept]:
    assert _SPACE is not None
    variants, ctx, _, _ = _SPACE
    tally, skip = Tally(), _PAST.skip if _PAST is not None else None
    return tally, kept(_judged_part(layout_ladders(variants, ctx, part[0], tally, part[1], skip=skip)), ctx)


def _judged_part(ladders: Iterable[Ladder]) -> Generator[list[Verdict], None, None]:
    """``judge`` of a worker's ladders, telling it the closest miss the worker has seen."""
    global _CLOSEST
    assert _SPACE is not None
    _, ctx, estimator, fits_only = _SPACE
    for ladder in ladders:
        verdicts = judge(ladder, ctx, estimator, fits_only=fits_only, closest=_CLOSEST, past=_PAST)
        _CLOSEST = _closer(_CLOSEST, verdicts)
        yield verdicts
