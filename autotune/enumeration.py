"""Every legal plan of a space's choices, as micro-batch ladders; illegal combinations counted by rule.

Plans that differ only in micro-batch form a ladder, smallest first (memory grows with it, so a caller can
stop at the first plan that does not fit). Illegal combinations are never constructed; they are counted by
the rule they break, first failing rule wins (``autotune.spacerules``). Knobs that do not matter in a
combination are collapsed, not counted (schedule when PP = 1, virtual stages unless interleaved, the HSDP
group size unless HSDP, sequence parallel when TP = 1). ``autotune.space`` re-exports these names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import TYPE_CHECKING, Any

from autotune.plan import ParallelPlan, Schedule, Sharding
from autotune.spacerules import (
    BATCH_RULE,
    COLLAPSED_KNOBS,
    HEAD_FIELDS,
    KNOBS,
    SHARDING_RULE,
    Variant,
    collapse,
    head_rule,
    layout_rule,
    offers,
    pipeline_rule,
    plain,
    rest_rule,
)

if TYPE_CHECKING:
    from autotune.space import PlanContext

__all__ = [
    "Ladder",
    "Layout",
    "Skip",
    "Tally",
    "Variant",
    "Variants",
    "batch_blocks_every_layout",
    "enumerate_plans",
    "layout_candidates",
    "layout_dps",
    "layout_ladders",
    "layouts",
]


@dataclass(frozen=True, slots=True)
class Ladder:
    """Legal plans that differ only in micro-batch, smallest first."""

    fields: dict[str, Any]
    micro_batches: tuple[int, ...]

    def plan(self, micro_batch: int) -> ParallelPlan:
        return ParallelPlan(micro_batch=micro_batch, **self.fields)


@dataclass
class Tally:
    """What an enumeration saw: illegal combinations by rule, and the values legal plans use per knob."""

    pruned: Counter[str] = field(default_factory=Counter)
    legal_values: dict[str, set[Any]] = field(default_factory=lambda: {k: set() for k in KNOBS})
    num_legal: int = 0

    def count(self, reason: str, n: int) -> None:
        if n:
            self.pruned[reason] += n

    def merge(self, other: Tally) -> None:
        """Add what another enumeration (of other layouts) saw."""
        self.pruned.update(other.pruned)
        for knob, values in other.legal_values.items():
            self.legal_values[knob] |= values
        self.num_legal += other.num_legal

    def record(self, ladder: Ladder) -> None:
        self.num_legal += len(ladder.micro_batches)
        for knob in KNOBS:
            if knob != "micro_batch":
                self.legal_values[knob].add(ladder.fields[knob])
        self.legal_values["micro_batch"].update(ladder.micro_batches)

    def choices(self) -> dict[str, list[Any]]:
        """The legal values as plain JSON/Optuna values, sorted: the categorical choices of the study."""
        return {
            k: sorted((plain(v) for v in vs), key=lambda x: (x is not None, x))
            for k, vs in self.legal_values.items()
        }


def enumerate_plans(
    choices: Mapping[str, tuple[Any, ...]],
    ctx: PlanContext,
    tally: Tally | None = None,
    variants: Variants | None = None,
    skip: Skip | None = None,
) -> Iterator[Ladder]:
    """Every legal plan of ``choices``, as micro-batch ladders; illegal combinations counted in ``tally``.
    ``variants``: made before from choices that differ at most in layout degrees (``Variants.serves``);
    ``skip``: see ``Skip``."""
    tally = tally if tally is not None else Tally()
    variants = variants if variants is not None else Variants(choices)
    for layout in layouts(choices, ctx):
        yield from layout_ladders(variants, ctx, layout, tally, skip=skip)


Layout = tuple[int, int, int]
"""(TP, PP, CP); DP follows from the GPU count."""

Skip = Callable[[tuple[int, int, int, int], int, Variant], bool]
"""A caller's test of a variant before any rule, given (TP, PP, CP, DP) and the micro-batch its ladder would
start at: True drops the variant, uncounted (a caller that asks only whether some plan fits and already
knows this one cannot: ``rankworkers.judge``'s ``fits_only``). Given a skip, a variant whose every
micro-batch the pipeline rule prunes is dropped uncounted too."""


def layouts(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext) -> list[Layout]:
    """The layouts ``enumerate_plans`` visits, in its order (``--dp`` pins the layout: other layouts are
    outside the space, not pruned)."""
    return [
        (tp, pp, cp)
        for tp, pp, cp in product(choices["tp"], choices["pp"], choices["cp"])
        if ctx.dp is None or tp * pp * cp * ctx.dp == ctx.cluster.num_gpus
    ]


class Variants:
    """The non-layout combinations of ``choices`` per (TP, PP > 1, CP), made once: the offered ones and how
    many there were."""

    def __init__(self, choices: Mapping[str, tuple[Any, ...]]) -> None:
        self.choices = choices
        self._made: dict[tuple[int, bool, int], tuple[list[Variant], int]] = {}

    def of(self, tp: int, pp: int, cp: int) -> tuple[list[Variant], int]:
        key = (tp, pp > 1, cp)
        if key not in self._made:
            self._made[key] = _variants(self.choices, *key)
        return self._made[key]

    def serves(self, choices: Mapping[str, tuple[Any, ...]]) -> bool:
        """Whether these are the variants of ``choices`` too: they differ at most in the layout degrees (a
        cluster's GPU count bounds TP), which pick among the variants rather than change them."""
        return _beyond_layout(choices) == _beyond_layout(self.choices)


def _beyond_layout(choices: Mapping[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    return {k: v for k, v in choices.items() if k not in ("tp", "pp", "cp")}


def layout_ladders(
    variants: Variants,
    ctx: PlanContext,
    layout: Layout,
    tally: Tally,
    part: tuple[int, int] | None = None,
    *,
    skip: Skip | None = None,
) -> Iterator[Ladder]:
    """The ladders of one layout, in ``enumerate_plans``' order; what it prunes counted in ``tally``.
    ``part``: only the ladders of the offered variants ``start:stop`` (``layout_candidates``), the
    layout's own counts with the part that starts at 0: the parts of a layout make the whole. ``skip``:
    see ``Skip``."""
    (tp, pp, cp), choices = layout, variants.choices
    kept, total = variants.of(tp, pp, cp)
    start, stop = part if part is not None else (0, len(kept))
    num_mbs = len(choices["micro_batch"])
    reason = layout_rule(ctx, tp, pp, cp)
    if reason:
        tally.count(reason, total * num_mbs if start == 0 else 0)
        return
    dp = ctx.cluster.num_gpus // (tp * pp * cp)
    mbs = tuple(m for m in choices["micro_batch"] if ctx.global_batch % (dp * m) == 0)
    if start == 0:
        tally.count(BATCH_RULE, total * (num_mbs - len(mbs)))
    if mbs:  # a sharding the framework lacks fails ``variant_rule`` first, whatever the layout
        tally.count(SHARDING_RULE, (total - len(kept)) * len(mbs) if start == 0 else 0)
        yield from _ladders(ctx, kept[start:stop], (tp, pp, cp, dp), mbs, tally, skip)


def layout_candidates(variants: Variants, ctx: PlanContext, layout: Layout) -> int:
    """Ladders ``layout_ladders`` may yield at most (its offered variants, when the layout and the global
    batch allow any): a size known before the variant rules run."""
    tp, pp, cp = layout
    if layout_rule(ctx, tp, pp, cp):
        return 0
    dp = ctx.cluster.num_gpus // (tp * pp * cp)
    if not any(ctx.global_batch % (dp * m) == 0 for m in variants.choices["micro_batch"]):
        return 0
    return len(variants.of(tp, pp, cp)[0])


def _ladders(
    ctx: PlanContext,
    variants: list[Variant],
    layout: tuple[int, int, int, int],
    mbs: tuple[int, ...],
    tally: Tally,
    skip: Skip | None = None,
) -> Iterator[Ladder]:
    tp, pp, cp, dp = layout
    starts: dict[Schedule, int | None] = {}  # where a schedule's ladders start: the rule below, uncounted
    heads: dict[tuple[Any, ...], str | None] = {}  # ``variant_rule``'s first rules, asked once per head
    for v in variants:
        head = v[:HEAD_FIELDS]
        if head not in heads:
            heads[head] = head_rule(ctx, head, tp, pp, cp, dp)
        if skip is not None and not heads[head]:
            if v.schedule not in starts:
                ok = (m for m in mbs if not pipeline_rule(v.schedule, pp, ctx.global_batch // (dp * m)))
                starts[v.schedule] = next(ok, None)
            m0 = starts[v.schedule]
            if m0 is None or skip(layout, m0, v):
                continue
        reason = heads[head] or rest_rule(ctx, v, tp, pp, cp, dp)
        if reason:
            tally.count(reason, len(mbs))
            continue
        good = []
        for m in mbs:
            reason = pipeline_rule(v.schedule, pp, ctx.global_batch // (dp * m))
            if reason:
                tally.count(reason, 1)
            else:
                good.append(m)
        if good:
            ladder = Ladder(
                {
                    "tp": tp,
                    "pp": pp,
                    "dp": dp,
                    "cp": cp,
                    "global_batch": ctx.global_batch,
                    "seq_len": ctx.seq_len,
                    **ctx.routing(),
                    **ctx.stored(),
                    **v._asdict(),
                },
                tuple(good),
            )
            tally.record(ladder)
            yield ladder


def _stage_counts(schedule: Schedule, virtual_stages: tuple[int, ...]) -> tuple[int, ...]:
    """Virtual-stage counts a schedule runs with: the space's for the looped ones, 1 for the others, two for
    ZBV's V (a space or pin without 2 keeps its counts, which the rule then prunes with the reason)."""
    if schedule.v_shape:
        return (2,) if 2 in virtual_stages else virtual_stages
    return virtual_stages if schedule.looped else (1,)


def _variants(
    choices: Mapping[str, tuple[Any, ...]], tp: int, pp_gt1: bool, cp: int
) -> tuple[list[Variant], int]:
    """The non-layout combinations, with knobs that do not matter here collapsed to their default: those
    whose framework offers their sharding (``offers``), and how many there are in all. The others are
    counted, not made (two thirds of an MoE space's ~230k per key)."""
    one = {k: tuple(dict.fromkeys(vs)) for k, vs in choices.items()}  # each combination once
    schedules = [(s, v) for s in one["schedule"] for v in _stage_counts(s, one["virtual_stages"])]
    schedules = list(dict.fromkeys(schedules)) if pp_gt1 else [(Schedule.ONE_F_ONE_B, 1)]
    sps = one["sequence_parallel"] if tp > 1 else (False,)  # a pin of True collapses too: SP needs TP
    out: list[Variant] = []
    total = 0
    speeds: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}  # (fw, sp, prec, EP > 1) -> knobs that matter
    for fw, sharding in product(one["framework"], one["sharding"]):
        made = offers(fw, sharding)
        for hsdp in one["hsdp_shard_size"] if sharding is Sharding.HSDP else (None,):
            rest = product(
                one["offload"], schedules, one["recompute"], sps, one["precision"], one["ep"], one["etp"]
            )
            for offload, (sched, vs), rc, sp, prec, ep, etp in rest:
                head = (fw, sharding, hsdp, offload, sched, vs, rc, sp, prec, ep, etp)
                key = (fw, sp, prec, ep > 1)
                if key not in speeds:  # collapse before multiplying: most combinations leave one value each
                    collapsed = (
                        collapse(Variant._make((*head, *speed)), tp, cp)
                        for speed in product(*(one[k] for k in COLLAPSED_KNOBS))
                    )
                    speeds[key] = list(dict.fromkeys(c[_HEAD:] for c in collapsed))
                total += len(speeds[key])
                if made:
                    out += [Variant._make((*head, *speed)) for speed in speeds[key]]
    return out, total


_HEAD = len(Variant._fields) - len(COLLAPSED_KNOBS)
"""The collapsed knobs are the last fields of ``Variant``: a variant is its head and a combination of them."""
assert Variant._fields[_HEAD:] == COLLAPSED_KNOBS


def batch_blocks_every_layout(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext) -> bool:
    """Whether the global batch is what leaves no plan: layouts pass the layout rules, and none of them has
    a micro-batch that, times its DP, divides the batch (else other rules pruned the plans: say those)."""
    dps = layout_dps(choices, ctx)
    return bool(dps) and not any(ctx.global_batch % (d * m) == 0 for d in dps for m in choices["micro_batch"])


def layout_dps(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext) -> set[int]:
    """DP degrees of the layouts that pass the layout rules (the global batch is not looked at)."""
    dps = set()
    for tp, pp, cp in product(choices["tp"], choices["pp"], choices["cp"]):
        if not layout_rule(ctx, tp, pp, cp):
            dp = ctx.cluster.num_gpus // (tp * pp * cp)
            if ctx.dp is None or dp == ctx.dp:
                dps.add(dp)
    return dps
