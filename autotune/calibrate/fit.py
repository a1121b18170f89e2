"""Fit the cost model's calibratable factors to measured step times; measure how well it ranks and predicts.

The factors are the step-time model's documented knobs that live on the specs as data (``Factors``):

=========================  ==================================================================================
``gemm_efficiency``        ``GPUSpec``: fraction of the dense peak GEMMs reach (scales all compute)
``collective_efficiency``  ``ClusterSpec``: fraction of link bandwidth collectives reach (scales all comm)
``dp_overlap_fraction``    ``ClusterSpec``: share of compute DP/ZeRO/FSDP traffic hides behind (overlap.py)
``latency_scale``          ``LinkSpec.latency_s`` and ``ring_hop_s`` of both links x this: the alpha of every
                           collective and send (NCCL's per-collective base, ``comm.NCCL_RING_BASE_S``, stays)
``host_scale``             ``GPUSpec``'s host-time terms x this (rates / this): eager operators, DTensor,
                           pipeline actions, FSDP2 / ZeRO-3 hooks -- host work the device does not hide
                           (0 on GPUs, so it only moves CPU trials)
``shared_core_latency``    ``ClusterSpec``: share of a ring step's latency that queues behind the node's other
                           groups of the axis when ranks share cores (``comm.group_link``; CPU trials only)
``step_overhead_s``        ``ClusterSpec``: fixed seconds per optimizer step no kernel term covers
``microbatch_overhead_s``  ``ClusterSpec``: fixed seconds per micro-batch (dispatch, hooks)
=========================  ==================================================================================

``fit`` minimises ``sum_i (log predicted_i - log measured_i)^2`` within ``BOUNDS`` (scipy ``least_squares``,
trust-region reflective, three starting points): log residuals weigh a 10 % miss on a 20 ms plan like one on a
2 s plan, and only ratios matter for ranking. The three efficiency factors are always fitted; the host scale,
the latency scale, the shared-core latency and the pair of overheads only when the data needs them: each is
kept if it lowers the AIC ``n log(RSS/n) + 2k`` (greedy forward selection, in that order) and ends inside its
search limits (``_at_bound``). A calibrated cluster is ``Factors.apply(cluster)`` -- a new ``ClusterSpec``
with new ``LinkSpec``s, never a changed module global.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.costmodel.overlap import DP_OVERLAP_FRACTION
from autotune.costmodel.steptime import step_time
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, GPUSpec, ModelSpec

__all__ = [
    "Factors",
    "BASE",
    "EXTRAS",
    "OVERHEADS",
    "BOUNDS",
    "Observation",
    "Fidelity",
    "FitResult",
    "fit",
    "fidelity",
    "kendall_tau",
    "predict_s",
]

BASE = ("gemm_efficiency", "collective_efficiency", "dp_overlap_fraction")
OVERHEADS = ("step_overhead_s", "microbatch_overhead_s")
"""The group ``fit(overheads=...)`` forces in or out."""
EXTRAS = (("host_scale",), ("latency_scale",), ("shared_core_latency",), OVERHEADS)
"""Groups added to ``BASE`` only when the AIC asks for them."""
BOUNDS = {
    "gemm_efficiency": (1e-3, 1.0),
    "collective_efficiency": (1e-3, 1.0),
    "dp_overlap_fraction": (0.0, 1.0),
    "latency_scale": (0.1, 1000.0),
    "host_scale": (0.1, 10.0),
    "shared_core_latency": (0.0, 1.0),
}
"""Bounds of the efficiency factors; the overheads are bounded by 0 and the slowest measured step."""
_LOG = {"gemm_efficiency", "collective_efficiency", "latency_scale", "host_scale"}
"""Searched in log space: they span decades."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Factors:
    gemm_efficiency: float
    collective_efficiency: float
    dp_overlap_fraction: float
    latency_scale: float = 1.0
    """Relative to the links of the cluster the factors are applied to."""
    host_scale: float = 1.0
    """Relative to the host-time terms of the GPU spec the factors are applied to (``_scale_host``)."""
    shared_core_latency: float = 0.0
    step_overhead_s: float = 0.0
    microbatch_overhead_s: float = 0.0

    @classmethod
    def of(cls, cluster: ClusterSpec) -> Factors:
        """The factors a cluster carries now (catalog, profile or an earlier calibration)."""
        overlap = cluster.dp_overlap_fraction
        return cls(
            gemm_efficiency=cluster.gpu.gemm_efficiency,
            collective_efficiency=cluster.collective_efficiency,
            dp_overlap_fraction=DP_OVERLAP_FRACTION if overlap is None else overlap,
            step_overhead_s=cluster.step_overhead_s,
            microbatch_overhead_s=cluster.microbatch_overhead_s,
            shared_core_latency=cluster.shared_core_latency,
        )

    def apply(self, cluster: ClusterSpec, label: str | None = None) -> ClusterSpec:
        """``cluster`` carrying these factors (and ``label`` in ``ClusterSpec.profile``)."""
        gpu = dataclasses.replace(
            _scale_host(cluster.gpu, self.host_scale), gemm_efficiency=self.gemm_efficiency
        )
        profile = cluster.profile if label is None else "; ".join(p for p in (cluster.profile, label) if p)
        intra, inter = (
            dataclasses.replace(
                link,
                latency_s=link.latency_s * self.latency_scale,
                ring_hop_s=None if link.ring_hop_s is None else link.ring_hop_s * self.latency_scale,
            )
            for link in (cluster.intra_link, cluster.inter_link)
        )
        return dataclasses.replace(
            cluster,
            gpu=gpu,
            intra_link=intra,
            inter_link=inter,
            collective_efficiency=self.collective_efficiency,
            dp_overlap_fraction=self.dp_overlap_fraction,
            step_overhead_s=self.step_overhead_s,
            microbatch_overhead_s=self.microbatch_overhead_s,
            shared_core_latency=self.shared_core_latency,
            profile=profile,
        )

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def _scale_host(gpu: GPUSpec, scale: float) -> GPUSpec:
    """``gpu`` with every host-time term x ``scale`` and every host rate / ``scale``: a host that runs
    ``1 / scale`` as fast as when its terms were measured (a CPU VM drifts 1.2-2.6x from day to day:
    benchmarks/results/calibration_summary.md, probe drift)."""
    if scale == 1.0:
        return gpu
    return dataclasses.replace(gpu, host=gpu.host.scaled(scale))


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One measured plan."""

    plan: ParallelPlan
    measured_s: float
    """Measured step time (median of the measured steps)."""
    label: str = ""
    """Where it came from (trial number, landscape key)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Fidelity:
    """Predicted vs measured step times of a set of plans."""

    predicted_s: tuple[float, ...]
    measured_s: tuple[float, ...]
    labels: tuple[str, ...]
    kendall_tau: float | None
    """Rank agreement of predicted and measured step times (tau-b; None below 2 plans)."""
    mape: float
    """Mean absolute percentage error of the predicted step time."""

    def as_dict(self) -> dict[str, Any]:
        return {"kendall_tau": self.kendall_tau, "mape": self.mape, "num_trials": len(self.measured_s)}


@dataclass(frozen=True, kw_only=True, slots=True)
class FitResult:
    factors: Factors
    fitted: tuple[str, ...]
    """The factors the fit moved (overheads only when the AIC asked for them)."""
    before: Fidelity
    after: Fidelity
    rms_log_error: float
    unidentified: tuple[str, ...] = ()
    """Fitted factors that no observed plan depends on: they kept their starting value."""


def predict_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    return step_time(model, cluster, plan).step_time_s


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Kendall's tau-b (scipy.stats.kendalltau); None below 2 points or when one side is constant."""
    if len(xs) < 2:
        return None
    from scipy.stats import kendalltau

    tau = kendalltau(xs, ys).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def fidelity(model: ModelSpec, cluster: ClusterSpec, observations: Sequence[Observation]) -> Fidelity:
    predicted = tuple(predict_s(model, cluster, o.plan) for o in observations)
    measured = tuple(o.measured_s for o in observations)
    mape = sum(abs(p - m) / m for p, m in zip(predicted, measured, strict=True)) / max(1, len(measured))
    return Fidelity(
        predicted_s=predicted,
        measured_s=measured,
        labels=tuple(o.label for o in observations),
        kendall_tau=kendall_tau(predicted, measured),
        mape=mape,
    )


def _solve(
    residuals: Callable[[Sequence[float]], list[float]],
    starts: list[list[float]],
    lower: list[float],
    upper: list[float],
) -> tuple[list[float], float]:
    from scipy.optimize import least_squares

    best: tuple[list[float], float] | None = None
    for x0 in starts:
        x0 = [min(max(v, lo + 1e-9), hi - 1e-9) for v, lo, hi in zip(x0, lower, upper, strict=True)]
        res = least_squares(residuals, x0, bounds=(lower, upper), method="trf", x_scale="jac")
        if best is None or res.cost < best[1]:
            best = (list(res.x), float(res.cost))
    assert best is not None
    return best


def _fit_set(
    model: ModelSpec, cluster: ClusterSpec, obs: Sequence[Observation], names: tuple[str, ...], start: Factors
) -> tuple[Factors, float]:
    """Fit ``names`` (the rest stay at ``start``); returns the factors and the residual sum of squares."""
    scale = max(o.measured_s for o in obs)
    log_named = _LOG

    def to_factors(x: Sequence[float]) -> Factors:
        values = start.as_dict()
        for name, v in zip(names, x, strict=True):
            scaled = math.exp(v) if name in log_named else v * scale if name.endswith("_s") else v
            values[name] = float(scaled)
        return Factors(**values)

    def bounds(name: str) -> tuple[float, float]:
        lo, hi = BOUNDS.get(name, (0.0, 1.0))
        return (math.log(lo), math.log(hi)) if name in log_named else (lo, hi)

    def to_x(f: Factors) -> list[float]:
        d = f.as_dict()
        return [
            math.log(d[n]) if n in log_named else d[n] / scale if n.endswith("_s") else d[n] for n in names
        ]

    def residuals(x: Sequence[float]) -> list[float]:
        calibrated = to_factors(x).apply(cluster)
        return [math.log(predict_s(model, calibrated, o.plan) / o.measured_s) for o in obs]

    lower, upper = zip(*(bounds(n) for n in names), strict=True)
    starts = [
        to_x(start),
        to_x(
            dataclasses.replace(
                start,
                gemm_efficiency=start.gemm_efficiency / 4,
                collective_efficiency=start.collective_efficiency / 4,
            )
        ),
        to_x(
            dataclasses.replace(
                start, dp_overlap_fraction=0.2, gemm_efficiency=min(1.0, 2 * start.gemm_efficiency)
            )
        ),
    ]
    x, cost = _solve(residuals, starts, list(lower), list(upper))
    return to_factors(x), 2 * cost


def fit(
    model: ModelSpec,
    cluster: ClusterSpec,
    observations: Sequence[Observation],
    *,
    overheads: bool | None = None,
) -> FitResult:
    """Fit the factors to ``observations`` (all of one model and cluster). ``overheads``: True/False forces
    the two overhead terms in or out; None lets the AIC decide (as it always does for ``latency_scale``)."""
    if len(observations) < 2:
        raise ValueError(f"a fit needs at least 2 measured plans, got {len(observations)}")
    start = Factors.of(cluster)
    n = len(observations)
    slowest_s = max(o.measured_s for o in observations)
    factors, rss = _fit_set(model, cluster, observations, BASE, start)
    names: tuple[str, ...] = BASE
    for group in EXTRAS:
        is_overheads = group == OVERHEADS
        if is_overheads and overheads is False:
            continue
        force = is_overheads and overheads is True
        trial_names = names + group
        if n <= len(trial_names) and not force:
            continue
        f1, rss1 = _fit_set(model, cluster, observations, trial_names, factors)
        if not force and _at_bound(f1, group, slowest_s):
            continue
        if force or _aic(rss1, n, len(trial_names)) < _aic(rss, n, len(names)):
            factors, rss, names = f1, rss1, trial_names
    calibrated = factors.apply(cluster)
    after = fidelity(model, calibrated, observations)
    pairs = zip(after.predicted_s, after.measured_s, strict=True)
    rms = math.sqrt(sum(math.log(p / m) ** 2 for p, m in pairs) / n)
    return FitResult(
        factors=factors,
        fitted=names,
        before=fidelity(model, cluster, observations),
        after=after,
        rms_log_error=rms,
        unidentified=_unidentified(model, calibrated, observations, names),
    )


def _at_bound(factors: Factors, group: tuple[str, ...], slowest_s: float) -> bool:
    """Whether a factor of ``group`` ended on a search limit rather than inside it: a scale at 0.1x or 10x
    (``BOUNDS``), an overhead as long as the slowest measured step. The data pushed it past anything the
    machine can be -- what a few noisy trials do (5 trials of the DeepSpeed head-to-head put the host scale at
    0.1 and the collective efficiency at 0.03) -- so the group is not kept. The physical ends of a fraction
    (0 and 1 of the shared-core latency) are values it may take."""
    for name in group:
        value = getattr(factors, name)
        if name in _LOG:
            lo, hi = BOUNDS[name]
            if value <= lo * (1 + 1e-6) or value >= hi * (1 - 1e-6):
                return True
        elif name.endswith("_s") and value >= slowest_s * (1 - 1e-6):
            return True
    return False


def _aic(rss: float, n: int, k: int) -> float:
    return n * math.log(max(rss, 1e-300) / n) + 2 * k


def _unidentified(
    model: ModelSpec, cluster: ClusterSpec, obs: Sequence[Observation], names: tuple[str, ...]
) -> tuple[str, ...]:
    """Fitted factors no observed plan depends on (e.g. no plan has DP traffic): they kept their start."""
    base = [predict_s(model, cluster, o.plan) for o in obs]
    f = Factors.of(cluster)
    out = []
    for name in names:
        value = getattr(f, name)
        nudged = value * 0.9 if value > 0 else max(o.measured_s for o in obs) * 0.01
        moved = dataclasses.replace(f, **{name: nudged}).apply(cluster)
        if all(abs(predict_s(model, moved, o.plan) - b) <= 1e-12 * b for o, b in zip(obs, base, strict=True)):
            out.append(name)
    return tuple(out)
