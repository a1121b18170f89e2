"""Explain one plan: where its step time and memory go, what binds, and the one-knob changes that help most.

Neighbours change exactly one knob (TP or PP x2 / /2 with DP taking up the rest, micro-batch x2 / /2, the
recompute level, sequence parallel on, the sharding stage +-1 within the framework, virtual stages, offload;
for Megatron MoE plans with EP > 1 the EP overlap, the dispatcher and the experts' activation offload).
Only legal plans are kept (``ParallelPlan`` rules and ``check_plan``). A feasible plan's suggestions are the
feasible neighbours ranked by predicted tokens/s gain; an infeasible plan's are ranked by memory freed,
feasible ones first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from autotune.costmodel import Estimate, estimate
from autotune.errors import ConfigError
from autotune.plan import (
    OFFLOAD_MODULES,
    Framework,
    MoeDispatcher,
    ParallelPlan,
    Recompute,
    Schedule,
    Sharding,
    check_plan,
)
from autotune.ranking import Estimator
from autotune.render import gib
from autotune.report.data import memory_groups, time_groups
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["Suggestion", "Explanation", "explain", "neighbours"]

_STAGES: dict[Framework, tuple[Sharding, ...]] = {
    Framework.FSDP: (Sharding.NONE, Sharding.FSDP_GRAD_OP, Sharding.FSDP_FULL),
    Framework.DEEPSPEED: (Sharding.NONE, Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3),
    Framework.MEGATRON: (Sharding.NONE, Sharding.ZERO1),
}
"""Sharding stages in order of what they shard (FSDP: NO_SHARD < SHARD_GRAD_OP < FULL_SHARD)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Suggestion:
    change: str
    estimate: Estimate
    tokens_per_s_gain: float
    """Relative: 0.25 = 25% more tokens/s than the plan explained."""
    memory_freed_bytes: float

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return {
            "change": self.change,
            "feasible": est.feasible,
            "reasons": list(est.reasons),
            "tokens_per_s": est.tokens_per_s,
            "tokens_per_s_gain": self.tokens_per_s_gain,
            "memory_bytes_per_gpu": est.memory_bytes_per_gpu,
            "memory_freed_bytes": self.memory_freed_bytes,
            "bottleneck": est.bottleneck,
            "plan": est.plan.to_dict(),
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    estimate: Estimate
    binds: str
    """One sentence: what limits this plan."""
    suggestions: list[Suggestion]
    num_neighbours: int
    """Legal single-knob neighbours considered."""

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        step, cap = est.step_time_s, est.memory_capacity_bytes
        return {
            **est.to_dict(),
            "binds": self.binds,
            "num_neighbours": self.num_neighbours,
            "time_shares": {k: v / step for k, v in time_groups(est).items()},
            "memory_shares_of_capacity": {k: v / cap for k, v in memory_groups(est).items()},
            "suggestions": [s.to_dict() for s in self.suggestions],
        }


def _halve_double(value: int) -> list[int]:
    return [v for v in (value * 2, value // 2) if v >= 1 and v != value]


def _layout(plan: ParallelPlan, world: int, **degrees: int) -> dict[str, Any] | None:
    """Change TP or PP and give DP what is left of the GPUs; None when it does not divide."""
    tp, pp = degrees.get("tp", plan.tp), degrees.get("pp", plan.pp)
    if world % (tp * pp * plan.cp):
        return None
    changes: dict[str, Any] = {"tp": tp, "pp": pp, "dp": world // (tp * pp * plan.cp)}
    if tp == 1:
        changes["sequence_parallel"] = False
    if pp == 1:
        changes.update(schedule=Schedule.ONE_F_ONE_B, virtual_stages=1)
    return changes


def _candidates(plan: ParallelPlan, world: int) -> Iterator[tuple[str, dict[str, Any]]]:
    for tp in _halve_double(plan.tp):
        if (changes := _layout(plan, world, tp=tp)) is not None:
            yield f"TP {plan.tp} -> {tp} (DP {plan.dp} -> {changes['dp']})", changes
    for pp in _halve_double(plan.pp):
        if (changes := _layout(plan, world, pp=pp)) is not None:
            yield f"PP {plan.pp} -> {pp} (DP {plan.dp} -> {changes['dp']})", changes
    for mbs in _halve_double(plan.micro_batch):
        yield f"micro-batch {plan.micro_batch} -> {mbs}", {"micro_batch": mbs}
    for level in Recompute:
        if level is not plan.recompute:
            yield f"recompute {plan.recompute} -> {level}", {"recompute": level}
    if plan.tp > 1 and not plan.sequence_parallel:
        yield "sequence parallel on", {"sequence_parallel": True}
    stages = _STAGES[plan.framework]
    if plan.sharding in stages:
        i = stages.index(plan.sharding)
        for j in (i + 1, i - 1):
            if 0 <= j < len(stages):
                yield f"sharding {plan.sharding} -> {stages[j]}", {"sharding": stages[j]}
    if plan.pp > 1:
        for v in _halve_double(plan.virtual_stages):
            looped = plan.schedule if plan.schedule.looped else Schedule.INTERLEAVED
            schedule = looped if v > 1 else Schedule.ONE_F_ONE_B
            yield (
                f"virtual stages {plan.virtual_stages} -> {v} ({schedule})",
                {"virtual_stages": v, "schedule": schedule},
            )
    yield ("offload off" if plan.offload else "optimizer offload on"), {"offload": not plan.offload}
    if plan.ep > 1 and plan.framework is Framework.MEGATRON:  # the token exchange's own knobs
        yield (
            "EP all-to-all overlap " + ("off" if plan.moe_a2a_overlap else "on"),
            {"moe_a2a_overlap": not plan.moe_a2a_overlap},
        )
        for dispatcher in MoeDispatcher:
            if dispatcher is not plan.moe_dispatcher:
                yield f"MoE dispatcher {plan.moe_dispatcher} -> {dispatcher}", {"moe_dispatcher": dispatcher}
    if plan.framework is Framework.MEGATRON and plan.ep > 1:  # the routed experts' activations to the host
        mods = () if plan.offload_modules else OFFLOAD_MODULES
        yield f"offload {'+'.join(mods)}" if mods else "activation offload off", {"offload_modules": mods}


def neighbours(
    plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec
) -> Iterator[tuple[str, ParallelPlan]]:
    """Legal plans that differ from ``plan`` in one knob (DP follows TP/PP), with a label for the change."""
    for label, changes in _candidates(plan, cluster.num_gpus):
        try:
            other = plan.replace(**changes)
        except ConfigError:
            continue
        if not check_plan(other, model, cluster):
            yield label, other


def _binds(est: Estimate) -> str:
    if est.out_of_memory:
        mem = memory_groups(est)
        top = max(mem, key=mem.__getitem__)
        return (
            f"memory: needs {gib(est.memory_bytes_per_gpu)} of {gib(est.memory_capacity_bytes)} per GPU; "
            f"the largest part is {top} ({gib(mem[top])})"
        )
    if not est.feasible:
        return f"infeasible: {est.reasons[0]}"
    times = time_groups(est)
    top = max(times, key=times.__getitem__)
    return (
        f"{top}: {times[top] / est.step_time_s:.0%} of the {est.step_time_s * 1e3:,.0f} ms step "
        f"(MFU {est.mfu:.1%}, memory {est.memory_bytes_per_gpu / est.memory_capacity_bytes:.0%} full)"
    )


def explain(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    *,
    limit: int = 3,
    estimator: Estimator = estimate,
) -> Explanation:
    """The plan's estimate, what binds, and up to ``limit`` single-knob changes that help most."""
    illegal = check_plan(plan, model, cluster)
    if illegal:
        raise ConfigError(illegal[0])
    est = estimator(model, cluster, plan)
    found = []
    for label, other in neighbours(plan, model, cluster):
        e = estimator(model, cluster, other)
        found.append(
            Suggestion(
                change=label,
                estimate=e,
                tokens_per_s_gain=e.tokens_per_s / est.tokens_per_s - 1,
                memory_freed_bytes=est.memory_bytes_per_gpu - e.memory_bytes_per_gpu,
            )
        )
    if est.feasible:
        helpful = sorted(
            (s for s in found if s.estimate.feasible and s.tokens_per_s_gain > 0.005),
            key=lambda s: s.tokens_per_s_gain,
            reverse=True,
        )
    else:
        helpful = sorted(
            (s for s in found if s.memory_freed_bytes > 0),
            key=lambda s: (not s.estimate.feasible, -s.memory_freed_bytes),
        )
    return Explanation(
        estimate=est, binds=_binds(est), suggestions=helpful[:limit], num_neighbours=len(found)
    )
