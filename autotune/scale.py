"""How a model scales over GPU counts: the best plan per count, from the search's ranking (``rank_plans``).

For each count the whole space is ranked by the cost model, exactly as ``autotune search`` plans it, with the
user's global batch held fixed (scaling that changes the batch changes the training run). Scaling efficiency
is per-GPU tokens/s relative to the smallest count that fits. Where it falls below a threshold, the reason
is the time term whose share of the step grew most since the previous count that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from autotune.costmodel import Estimate, estimate
from autotune.errors import ConfigError
from autotune.ranking import Estimator, rank_plans
from autotune.render import plan_summary
from autotune.report.data import time_groups
from autotune.space import PlanContext, SearchSpace, batch_blocks_every_layout, resolve_choices
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["ScalePoint", "ScaleResult", "scale", "parse_tokens"]

_COMM_TERMS = {"TP comm", "CP comm", "PP bubble + p2p", "exposed DP comm", "offload"}
_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """``1T``, ``300B``, ``2.5e12`` -> tokens; ``ConfigError`` otherwise."""
    raw = text.strip().upper()
    factor = _SUFFIXES.get(raw[-1:], 1.0)
    try:
        value = float(raw[:-1] if raw[-1:] in _SUFFIXES else raw) * factor
    except ValueError:
        raise ConfigError(f"--tokens: expected a count such as 1T, 300B or 2e12, got {text!r}") from None
    if value <= 0:
        raise ConfigError(f"--tokens: expected a positive count, got {text!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalePoint:
    num_gpus: int
    status: str
    """ok | does not fit | batch | no legal plan | bad cluster."""
    detail: str = ""
    cluster: ClusterSpec | None = None
    best: Estimate | None = None
    num_feasible: int = 0
    efficiency: float | None = None
    train_time_s: float | None = None
    cost_dollars: float | None = None
    why: str | None = None
    """Set where efficiency is below the threshold: which time term grew."""

    @property
    def shares(self) -> dict[str, float] | None:
        if self.best is None:
            return None
        step = self.best.step_time_s
        return {label: s / step for label, s in time_groups(self.best).items()}

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "num_gpus": self.num_gpus,
            "status": self.status,
            "detail": self.detail,
            "num_nodes": self.cluster.num_nodes if self.cluster else None,
            "plan": best.plan.to_dict() if best else None,
            "summary": plan_summary(best.plan) if best else None,
            "tokens_per_s": best.tokens_per_s if best else None,
            "tokens_per_s_per_gpu": best.tokens_per_s_per_gpu if best else None,
            "mfu": best.mfu if best else None,
            "bottleneck": best.bottleneck if best else None,
            "memory_bytes_per_gpu": best.memory_bytes_per_gpu if best else None,
            "num_feasible_plans": self.num_feasible,
            "efficiency": self.efficiency,
            "train_time_s": self.train_time_s,
            "cost_dollars": self.cost_dollars,
            "step_time_shares": self.shares,
            "why": self.why,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleResult:
    model: ModelSpec
    points: list[ScalePoint]
    global_batch: int
    seq_len: int
    min_efficiency: float
    tokens: float | None = None
    price_per_gpu_hour: float | None = None

    @property
    def smallest_fit(self) -> int | None:
        return next((p.num_gpus for p in self.points if p.status == "ok"), None)

    @property
    def first_below(self) -> ScalePoint | None:
        """The first count whose efficiency is below the threshold."""
        return next(
            (p for p in self.points if p.efficiency is not None and p.efficiency < self.min_efficiency), None
        )

    def to_dict(self) -> dict[str, Any]:
        below = self.first_below
        return {
            "model": self.model.name,
            "num_params": self.model.num_params,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "tokens": self.tokens,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "min_efficiency": self.min_efficiency,
            "smallest_fit": self.smallest_fit,
            "first_below": below.num_gpus if below else None,
            "why": below.why if below else None,
            "points": [p.to_dict() for p in self.points],
        }


def scale(
    model: ModelSpec,
    counts: Sequence[int],
    cluster_at: Callable[[int], ClusterSpec],
    *,
    space: SearchSpace,
    global_batch: int,
    seq_len: int,
    pins: Mapping[str, Any] | None = None,
    tokens: float | None = None,
    price_per_gpu_hour: float | None = None,
    min_efficiency: float = 0.7,
    estimator: Estimator = estimate,
) -> ScaleResult:
    """The best plan per GPU count (ascending), with efficiency, time and cost to train, and why it drops."""
    points: list[ScalePoint] = []
    base: ScalePoint | None = None
    for n in sorted(set(counts)):
        point = _best_at(model, n, cluster_at, space, global_batch, seq_len, pins or {}, estimator)
        if point.best is not None:
            base = base or point
            point = _scored(point, base, _previous_ok(points), tokens, price_per_gpu_hour, min_efficiency)
        points.append(point)
    return ScaleResult(
        model=model,
        points=points,
        global_batch=global_batch,
        seq_len=seq_len,
        min_efficiency=min_efficiency,
        tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour,
    )


def _best_at(
    model: ModelSpec,
    n: int,
    cluster_at: Callable[[int], ClusterSpec],
    space: SearchSpace,
    global_batch: int,
    seq_len: int,
    pins: Mapping[str, Any],
    estimator: Estimator,
) -> ScalePoint:
    try:
        cluster = cluster_at(n)
        choices = resolve_choices(space, model, cluster, pins)
    except ConfigError as e:
        return ScalePoint(num_gpus=n, status="bad cluster", detail=str(e))
    ctx = PlanContext(model=model, cluster=cluster, global_batch=global_batch, seq_len=seq_len)
    ranking = rank_plans(choices, ctx, estimator)
    if ranking.feasible:
        return ScalePoint(
            num_gpus=n,
            status="ok",
            cluster=cluster,
            best=ranking.feasible[0],
            num_feasible=len(ranking.feasible),
        )
    if ranking.num_legal == 0 and batch_blocks_every_layout(choices, ctx):
        return ScalePoint(
            num_gpus=n,
            status="batch",
            cluster=cluster,
            detail=f"global batch {global_batch} cannot be divided over {n} GPUs by any legal layout",
        )
    if ranking.num_legal == 0:
        top = next(iter(ranking.pruned), "no legal plan")
        return ScalePoint(num_gpus=n, status="no legal plan", cluster=cluster, detail=top)
    closest = ranking.closest.reasons[0] if ranking.closest else "every legal plan is infeasible"
    return ScalePoint(num_gpus=n, status="does not fit", cluster=cluster, detail=closest)


def _previous_ok(points: list[ScalePoint]) -> ScalePoint | None:
    return next((p for p in reversed(points) if p.best is not None), None)


def _scored(
    point: ScalePoint,
    base: ScalePoint,
    prev: ScalePoint | None,
    tokens: float | None,
    price: float | None,
    min_efficiency: float,
) -> ScalePoint:
    assert point.best is not None and base.best is not None
    eff = point.best.tokens_per_s_per_gpu / base.best.tokens_per_s_per_gpu
    train_s = tokens / point.best.tokens_per_s if tokens else None
    cost = train_s / 3600 * point.num_gpus * price if train_s and price else None
    why = _why(point, prev) if eff < min_efficiency and prev is not None else None
    return replace(point, efficiency=eff, train_time_s=train_s, cost_dollars=cost, why=why)


def _why(point: ScalePoint, prev: ScalePoint) -> str:
    """The time term whose share of the step grew most since ``prev``, with the link it crosses."""
    now, before = point.shares or {}, prev.shares or {}
    term = max(now, key=lambda k: now[k] - before.get(k, 0.0))
    text = (
        f"{term} grows from {before.get(term, 0.0):.0%} to {now[term]:.0%} of the step "
        f"({prev.num_gpus} -> {point.num_gpus} GPUs)"
    )
    cluster, prev_cluster = point.cluster, prev.cluster
    if term in _COMM_TERMS and cluster and prev_cluster and cluster.num_nodes > 1:
        crossing = "now crosses nodes" if prev_cluster.num_nodes == 1 else f"{cluster.num_nodes} nodes"
        text += (
            f"; {crossing} over {cluster.nics_per_node}x {cluster.inter_link.key} "
            f"({cluster.inter_node_bw_per_gpu_bytes_per_s / 1e9:.2f} GB/s per GPU)"
        )
    return text
