"""Collect what a report shows from a stored study: ``runs/<study>/`` -> ``ReportData`` (no plotting here).

The study stays a plain Optuna study; everything comes from its trials' ``user_attrs`` (``plan``,
``predicted``, ``measured``, ``status``, ``reason``, ``value_source``), from ``summary.json`` (the
enumeration's pruned counts) and from ``best/plan.json`` (the model and the full cluster, links included).
Each plan is re-estimated with today's cost model for its breakdowns; the tokens/s a row ranks by is the
trial's own value (measured where measured).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import Estimate, estimate
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.render import plan_summary
from autotune.report.analysis import (
    ModelError,
    failed,
    importances,
    kendall_tau,
    model_error,
    pareto_front,
    pruned,
    status_of,
)
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trialrecord import plan_key, record_of

__all__ = [
    "TIME_GROUPS",
    "MEMORY_GROUPS",
    "time_groups",
    "memory_groups",
    "PlanRow",
    "ModelError",
    "ReportData",
    "collect",
    "kendall_tau",
    "pareto_front",
]

TIME_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute", ("compute_s",)),
    ("recompute", ("recompute_s",)),
    ("TP comm", ("tp_comm_s",)),
    ("CP comm", ("cp_comm_s",)),
    ("PP bubble + p2p", ("pp_bubble_s", "pp_p2p_s")),
    ("exposed DP comm", ("dp_comm_s",)),
    ("optimizer", ("optimizer_s",)),
    ("offload", ("offload_s",)),
    ("host overhead", ("overhead_s",)),
    ("EP all-to-all", ("ep_comm_s",)),
)
"""Step-time terms as the report stacks them (label -> ``TimeBreakdown`` fields); together they are the
whole step time (``host overhead``: eager and DTensor operators and ZeRO-3 hooks where the device does not
hide them, 0 on GPUs, plus what a calibration fits per step and micro-batch)."""
MEMORY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("weights", ("weights_bytes",)),
    ("gradients", ("gradients_bytes",)),
    ("optimizer states", ("optimizer_bytes",)),
    ("activations", ("activations_bytes", "logits_bytes")),
    ("gather buffers", ("prefetch_bytes",)),
    ("comm buckets", ("comm_buffer_bytes",)),
    ("runtime reserve", ("reserve_bytes", "fragmentation_bytes")),
)


def time_groups(est: Estimate) -> dict[str, float]:
    t = est.time.as_dict()
    return {label: sum(t[k] for k in keys) for label, keys in TIME_GROUPS}


def memory_groups(est: Estimate) -> dict[str, float]:
    m = est.memory.as_dict()
    return {label: sum(m[k] for k in keys) for label, keys in MEMORY_GROUPS}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRow:
    """One finished, feasible plan of the study."""

    trial: int
    plan: ParallelPlan
    status: str
    tokens_per_s: float
    """The trial's value: measured where measured, else predicted."""
    measured: bool
    predicted_tokens_per_s: float
    estimate: Estimate
    """Re-estimated now, for the breakdowns."""
    memory_bytes_per_gpu: float
    """Measured peak where measured, else predicted."""
    dollars_per_mtok: float | None = None

    @property
    def summary(self) -> str:
        return plan_summary(self.plan)

    @property
    def headroom_bytes(self) -> float:
        return self.estimate.memory_capacity_bytes - self.memory_bytes_per_gpu

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "plan": self.plan.to_dict(),
            "summary": self.summary,
            "status": self.status,
            "tokens_per_s": self.tokens_per_s,
            "measured": self.measured,
            "predicted_tokens_per_s": self.predicted_tokens_per_s,
            "memory_bytes_per_gpu": self.memory_bytes_per_gpu,
            "headroom_bytes": self.headroom_bytes,
            "dollars_per_mtok": self.dollars_per_mtok,
            "bottleneck": self.estimate.bottleneck,
            "time_breakdown_s": time_groups(self.estimate),
            "memory_breakdown_bytes": memory_groups(self.estimate),
        }


@dataclass(kw_only=True)
class ReportData:
    study: str
    study_dir: Path
    storage: str
    model: ModelSpec
    cluster: ClusterSpec
    cluster_note: str
    global_batch: int
    seq_len: int
    rows: list[PlanRow]
    """Every finished feasible plan, best first."""
    pareto: list[PlanRow]
    history: list[tuple[int, float, bool]]
    """(trial, tokens/s, measured) of finished trials, in trial order."""
    importances: dict[str, float] | None
    importance_note: str
    error: ModelError | None
    statuses: dict[str, int]
    pruned_enumeration: dict[str, int] = field(default_factory=dict)
    pruned_trials: dict[str, int] = field(default_factory=dict)
    failed_trials: dict[str, int] = field(default_factory=dict)
    price_per_gpu_hour: float | None = None

    def top(self, k: int) -> list[PlanRow]:
        return self.rows[:k]

    def to_dict(self, top: int = 10) -> dict[str, Any]:
        err = self.error
        return {
            "study": self.study,
            "study_dir": str(self.study_dir),
            "storage": self.storage,
            "model": self.model.name,
            "cluster": self.cluster.name,
            "cluster_note": self.cluster_note,
            "num_gpus": self.cluster.num_gpus,
            "global_batch": self.global_batch,
            "seq_len": self.seq_len,
            "statuses": self.statuses,
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "top": [r.to_dict() for r in self.top(top)],
            "pareto": [r.trial for r in self.pareto],
            "importances": self.importances,
            "importance_note": self.importance_note,
            "cost_model_error": None
            if err is None
            else {"num_measured": len(err.pairs), "mape": err.mape, "kendall_tau": err.kendall_tau},
            "pruned_enumeration": self.pruned_enumeration,
            "pruned_trials": self.pruned_trials,
            "failed_trials": self.failed_trials,
        }


def collect(study_dir: Path, *, price_per_gpu_hour: float | None = None) -> ReportData:
    """Read ``study_dir`` (``runs/<study>``); ``ConfigError`` when it is not an autotune study."""
    import optuna

    marker = study_dir / "study.json"
    if not marker.is_file():
        raise ConfigError(
            f"{study_dir}: no study.json here; pass a study made by `autotune search` (its name under --out)"
        )
    info = json.loads(marker.read_text())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=info["study"], storage=info["storage"])
    except KeyError:
        raise ConfigError(f"{study_dir}: study '{info['study']}' is not in {info['storage']}") from None
    model, cluster, note = _model_cluster(study_dir, info)
    trials = study.get_trials(deepcopy=False)
    rows = _rows(trials, model, cluster, price_per_gpu_hour)
    found, why = importances(study)
    summary = (
        json.loads((study_dir / "summary.json").read_text()) if (study_dir / "summary.json").is_file() else {}
    )
    return ReportData(
        study=info["study"],
        study_dir=study_dir,
        storage=info["storage"],
        model=model,
        cluster=cluster,
        cluster_note=note,
        global_batch=int(info["global_batch"]),
        seq_len=int(info["seq_len"]),
        rows=rows,
        pareto=pareto_front(rows),
        history=_history(trials),
        importances=found,
        importance_note=why,
        error=model_error(rows),
        statuses=dict(Counter(status_of(t) for t in trials).most_common()),
        pruned_enumeration=dict(summary.get("pruned_by_reason", {})),
        pruned_trials=pruned(trials),
        failed_trials=failed(trials),
        price_per_gpu_hour=price_per_gpu_hour,
    )


def _model_cluster(study_dir: Path, info: dict[str, Any]) -> tuple[ModelSpec, ClusterSpec, str]:
    """The model and cluster the study was made for: ``best/plan.json`` records the links too."""
    from autotune.emit import read_plan_document

    doc_path = study_dir / "best" / "plan.json"
    if doc_path.is_file():
        doc = read_plan_document(doc_path)
        if doc.model is not None and doc.cluster is not None and doc.cluster.num_gpus == info["num_gpus"]:
            return doc.model, doc.cluster, f"from {doc_path}"
    match = re.fullmatch(r"(\d+)x(\d+) (\S+)", str(info.get("cluster", "")))
    if not match:
        raise ConfigError(f"{study_dir}/study.json: cannot read cluster {info.get('cluster')!r}")
    nodes, per_node, gpu = int(match[1]), int(match[2]), match[3]
    cluster = make_cluster(num_gpus=nodes * per_node, gpu=gpu, gpus_per_node=per_node)
    return load_model(info["model"]), cluster, "default links for the GPU (no best/plan.json yet)"


def _rows(trials: list[Any], model: ModelSpec, cluster: ClusterSpec, price: float | None) -> list[PlanRow]:
    rows = []
    for t in trials:
        record = record_of(t)
        if t.value is None or record.plan is None or record.is_duplicate:
            continue
        if any(v > 0 for v in t.constraints.values()):
            continue
        plan = ParallelPlan.from_dict(dict(record.plan))
        measured = record.value_source == "measured"
        meas = record.measured
        est = estimate(model, cluster, plan)
        memory = meas.get("peak_memory_bytes") if measured else None
        dollars = price * cluster.num_gpus / 3600 / t.value * 1e6 if price else None
        rows.append(
            PlanRow(
                trial=t.number,
                plan=plan,
                status=record.shown_status,
                tokens_per_s=float(t.value),
                measured=measured,
                predicted_tokens_per_s=record.predicted.get("tokens_per_s", est.tokens_per_s),
                estimate=est,
                memory_bytes_per_gpu=memory or est.memory_bytes_per_gpu,
                dollars_per_mtok=dollars,
            )
        )
    return _unique(rows)


def _unique(rows: list[PlanRow]) -> list[PlanRow]:
    """One row per plan (knobs that do not matter, e.g. the schedule at PP=1, can make two trials one plan):
    the measured one first, then the faster; best first."""
    seen: dict[str, PlanRow] = {}
    for row in sorted(rows, key=lambda r: (not r.measured, -r.tokens_per_s)):
        seen.setdefault(plan_key(row.plan), row)
    return sorted(seen.values(), key=lambda r: r.tokens_per_s, reverse=True)


def _history(trials: list[Any]) -> list[tuple[int, float, bool]]:
    return [
        (t.number, float(t.value), record_of(t).value_source == "measured")
        for t in trials
        if t.value is not None
    ]
