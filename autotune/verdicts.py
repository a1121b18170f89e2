"""A judged plan (``Verdict``) and what a ranking keeps of judged ladders (``Kept``).

``rankworkers.judge`` gives a ladder's verdicts; a ranking keeps the plans that fit, counts the misses by rule
(``rule_of``: the reason without its numbers) and keeps the closest miss (least ``overcommit``), which the
"fits nowhere" answer shows. Workers send back a part's ``Kept``, not its verdicts.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from autotune.costmodel import Estimate, MemoryBreakdown
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec

if TYPE_CHECKING:
    from autotune.space import PlanContext

__all__ = ["Kept", "Miss", "Verdict", "kept", "overcommit", "rule_of"]


class Verdict(NamedTuple):
    """One plan of a ladder, judged."""

    estimate: Estimate | None
    """None: the plan refused to build (a ``plan.py`` rule the space does not mirror yet)."""
    reason: str | None = None
    """Why it does not fit or build; None when it fits within the memory headroom."""
    pruned: int = 0
    """Micro-batches pruned with it: it and the larger ones of its ladder, which cannot fit either."""
    plan: ParallelPlan | None = None
    """A plan the catalog cost model found not to fit from its memory alone (``fit_check``): no estimate, no
    step time spent on it; ``overcommit`` says by how much it missed."""
    overcommit: float | None = None
    """``overcommit`` of ``plan``'s memory (1.0: just fits), for the ranking's closest miss."""


Miss = tuple[float, Estimate | ParallelPlan]
"""A plan that did not fit, keyed by how far it missed (``overcommit``)."""


class Kept(NamedTuple):
    """Judged ladders as a ranking keeps them (``kept``): what a worker sends back instead of their verdicts
    (DeepSeek-V3 on 512 GPUs: 2.3M legal plans, 240k fit; pickling every miss's plan and reason was a tenth
    of the ranking's CPU)."""

    feasible: list[Estimate]
    """The plans that fit, in ladder order."""
    ladders: list[tuple[int, int]]
    """Per ladder: plans the cost model judged, and how many of them fit (``ranking.LadderJudged``)."""
    closest: Miss | None
    """The first of the least overcommitted misses, in ladder order."""
    pruned: Counter[str]
    """The misses by rule (``rule_of``), each with the micro-batches pruned with it (``Tally.pruned``)."""


def kept(verdicts: Iterable[list[Verdict]], ctx: PlanContext) -> Kept:
    """``verdicts`` (per ladder, in order) as a ranking keeps them: the plans that fit, the misses counted by
    rule with the micro-batches pruned with them, and the closest miss."""
    feasible: list[Estimate] = []
    ladders: list[tuple[int, int]] = []
    closest: Miss | None = None
    pruned: Counter[str] = Counter()
    for steps in verdicts:
        judged = sum(v.estimate is not None or v.plan is not None for v in steps)
        ladders.append((judged, sum(v.reason is None for v in steps)))
        for v in steps:
            if v.reason is None and v.estimate is not None:
                feasible.append(v.estimate)
                continue
            if v.pruned:
                pruned[rule_of(v.reason or "")] += v.pruned
            miss = _miss(v, ctx)
            if miss is not None and (closest is None or miss[0] < closest[0]):
                closest = miss
    return Kept(feasible, ladders, closest, pruned)


def _miss(v: Verdict, ctx: PlanContext) -> Miss | None:
    """A plan that did not fit, keyed by how far it missed; None for one that refused to build or that only
    its model states ruled out (``judge``: it cannot be the closest)."""
    if v.estimate is not None:
        return overcommit(v.estimate.memory, ctx.cluster), v.estimate
    if v.plan is not None and v.overcommit is not None:
        return v.overcommit, v.plan
    return None


def rule_of(reason: str) -> str:
    """A reason without its numbers: 'out of memory: needs 91.2 GiB ...' -> 'out of memory'."""
    return _rule(reason.split(":", 1)[0])


@functools.lru_cache(maxsize=256)
def _rule(head: str) -> str:  # a ranking asks for every miss; their heads are few
    return re.sub(r"\s*\b\d[\d.,]*\b", "", head).strip()


def overcommit(memory: MemoryBreakdown, cluster: ClusterSpec) -> float:
    """How far over its tightest memory (GPU or host) a plan is: 1.0 just fits."""
    return max(
        memory.total_bytes / cluster.gpu.memory_bytes,
        memory.host_bytes_per_node / cluster.host_memory_bytes_per_node,
    )
