"""The report's tables and captions as plain strings, so the HTML and the Markdown say the same thing."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.render import gib, param_count
from autotune.report.data import ReportData

__all__ = [
    "Table",
    "FIGURES",
    "headline",
    "facts",
    "top_table",
    "pruned_tables",
    "error_text",
    "dashboard_hint",
]


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    note: str = ""


FIGURES: tuple[tuple[str, str, str], ...] = (
    (
        "step_time",
        "Where the step time goes",
        "The cost model's step-time breakdown of the top plans: compute, recompute, tensor-parallel and "
        "context-parallel communication, pipeline bubble and sends, DP/sharding communication not hidden "
        "behind backward, optimizer step and offload traffic.",
    ),
    (
        "memory",
        "Where the memory goes",
        "Predicted memory on the most-loaded GPU of each top plan, by what it holds, against the GPU's "
        "capacity.",
    ),
    (
        "pareto",
        "Throughput vs memory headroom",
        "Every finished feasible plan. Plans on the front are not beaten on both tokens/s and headroom; "
        "headroom is capacity minus the measured peak where measured, else the prediction.",
    ),
    ("history", "Optimization history", "Each finished trial's tokens/s in the order Optuna ran them."),
    (
        "importance",
        "Parameter importances",
        "Which knobs explain tokens/s across the finished trials (optuna.importance, its default evaluator).",
    ),
    ("error", "The cost model on this cluster", "Predicted vs measured tokens/s of the measured trials."),
)
"""(key, title, caption) of each figure, in page order."""


def headline(data: ReportData) -> str:
    if not data.rows:
        return "No trial finished with a feasible plan yet."
    best = data.rows[0]
    source = "measured" if best.measured else "predicted by the cost model"
    est = best.estimate
    price = f", ${best.dollars_per_mtok:.3f} per million tokens" if best.dollars_per_mtok else ""
    return (
        f"Best plan: {best.summary} (trial {best.trial}): {best.tokens_per_s:,.0f} tokens/s ({source}"
        f"{price}); predicted MFU {est.mfu:.1%}, {gib(best.memory_bytes_per_gpu)} of "
        f"{gib(est.memory_capacity_bytes)} per GPU, bound by {est.bottleneck}."
    )


def facts(data: ReportData) -> list[tuple[str, str]]:
    c, m = data.cluster, data.model
    statuses = ", ".join(f"{n} {s}" for s, n in data.statuses.items()) or "none"
    return [
        ("study", f"{data.study} ({data.study_dir})"),
        ("model", f"{m.name} ({param_count(m.num_params)} parameters)"),
        (
            "cluster",
            f"{c.name}: {c.intra_link.key} inside nodes, {c.nics_per_node}x {c.inter_link.key} "
            f"per node ({data.cluster_note})",
        ),
        ("batch", f"{data.global_batch} sequences x {data.seq_len} tokens per step"),
        ("trials", statuses),
    ]


def top_table(data: ReportData, k: int) -> Table:
    priced = data.price_per_gpu_hour is not None
    headers = (
        "#",
        "trial",
        "plan",
        "tokens/s",
        "source",
        "predicted",
        "pred. error",
        "MFU (pred.)",
        "memory/GPU",
        "binds",
    ) + (("$/Mtok",) if priced else ())
    rows = []
    for i, r in enumerate(data.top(k), start=1):
        err = f"{(r.predicted_tokens_per_s - r.tokens_per_s) / r.tokens_per_s:+.0%}" if r.measured else ""
        row = (
            str(i),
            str(r.trial),
            r.summary,
            f"{r.tokens_per_s:,.0f}",
            "measured" if r.measured else "predicted",
            f"{r.predicted_tokens_per_s:,.0f}",
            err,
            f"{r.estimate.mfu:.1%}",
            gib(r.memory_bytes_per_gpu),
            r.estimate.bottleneck,
        ) + ((f"{r.dollars_per_mtok:.3f}",) if priced and r.dollars_per_mtok else ())
        rows.append(row)
    note = f"price: ${data.price_per_gpu_hour}/GPU-hour x {data.cluster.num_gpus} GPUs" if priced else ""
    return Table("Top plans: predicted vs measured", headers, rows, note)


def pruned_tables(data: ReportData) -> list[Table]:
    tables = []
    if data.pruned_enumeration:
        tables.append(
            Table(
                "Plans ruled out before the study (enumeration, last search)",
                ("reason", "plans"),
                [(r, f"{n:,}") for r, n in data.pruned_enumeration.items()],
            )
        )
    if data.pruned_trials:
        tables.append(
            Table(
                "Proposals pruned without launching",
                ("reason", "trials"),
                [(r, str(n)) for r, n in data.pruned_trials.items()],
            )
        )
    if data.failed_trials:
        tables.append(
            Table(
                "Trials that launched and failed",
                ("status: error", "trials"),
                [(r, str(n)) for r, n in data.failed_trials.items()],
            )
        )
    return tables


def error_text(data: ReportData) -> str:
    err = data.error
    if err is None:
        return "No measured trial yet: every number here is the cost model's prediction."
    tau = (
        "needs at least 2 measured trials"
        if err.kendall_tau is None
        else f"{err.kendall_tau:+.2f} (1 = the model ranks the measured plans in the measured order)"
    )
    return (
        f"{len(err.pairs)} measured trials: mean absolute percentage error {err.mape:.1%}; Kendall tau {tau}."
    )


def dashboard_hint(data: ReportData) -> str:
    return f"optuna-dashboard {data.storage}"
