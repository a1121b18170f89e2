"""Figures as PNG bytes: matplotlib's object API on the Agg canvas (no pyplot, no display, no global state).

Each function takes plain data (``ReportData`` rows, or numbers) and returns the PNG of one figure.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from autotune.report.data import MEMORY_GROUPS, TIME_GROUPS, ModelError, PlanRow, memory_groups, time_groups

__all__ = [
    "png",
    "step_time_png",
    "memory_png",
    "pareto_png",
    "history_png",
    "importance_png",
    "error_png",
    "scaling_png",
]

_GIB = 1024**3
_COLORS = (
    "#4c72b0",
    "#8c8c8c",
    "#dd8452",
    "#937860",
    "#da8bc3",
    "#c44e52",
    "#55a868",
    "#8172b3",
    "#ccb974",
    "#64b5cd",
)
_DPI = 110
_THOUSANDS = FuncFormatter(lambda x, _: f"{x:,.0f}")


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def _labels(rows: Sequence[PlanRow]) -> list[str]:
    return [f"#{i} (trial {r.trial})\n{r.summary}" for i, r in enumerate(rows, start=1)]


def _stacked_barh(ax, labels: list[str], parts: dict[str, list[float]]) -> None:  # type: ignore[no-untyped-def]
    left = [0.0] * len(labels)
    ys = list(range(len(labels)))[::-1]  # best plan on top
    for color, (name, values) in zip(_COLORS, parts.items(), strict=False):
        if any(values):
            ax.barh(ys, values, left=left, color=color, label=name, height=0.6)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_yticks(ys, labels, fontsize=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def step_time_png(rows: Sequence[PlanRow]) -> bytes:
    """Stacked bars: where each plan's step time goes (the cost model's breakdown)."""
    fig = Figure(figsize=(9, 1.2 + 0.55 * len(rows)))
    ax = fig.add_subplot()
    parts = {label: [time_groups(r.estimate)[label] for r in rows] for label, _ in TIME_GROUPS}
    _stacked_barh(ax, _labels(rows), parts)
    ax.set_xlabel("predicted step time (s)")
    ax.set_title("Step time breakdown (cost model)", fontsize=10)
    return png(fig)


def memory_png(rows: Sequence[PlanRow]) -> bytes:
    """Stacked bars: memory per GPU by what it holds, against the GPU's capacity."""
    fig = Figure(figsize=(9, 1.2 + 0.55 * len(rows)))
    ax = fig.add_subplot()
    parts = {label: [memory_groups(r.estimate)[label] / _GIB for r in rows] for label, _ in MEMORY_GROUPS}
    _stacked_barh(ax, _labels(rows), parts)
    capacity = rows[0].estimate.memory_capacity_bytes / _GIB if rows else 0
    ax.axvline(capacity, color="black", linestyle="--", linewidth=1)
    ax.text(capacity, len(rows) - 0.45, f"capacity {capacity:.0f} GiB ", fontsize=7, va="bottom", ha="right")
    ax.set_xlabel("memory per GPU, worst rank (GiB, cost model)")
    ax.set_title("Memory breakdown vs capacity", fontsize=10)
    return png(fig)


def pareto_png(rows: Sequence[PlanRow], front: Sequence[PlanRow]) -> bytes:
    """Every finished plan by tokens/s and memory headroom; the Pareto front joined ($/Mtok if priced)."""
    fig = Figure(figsize=(8, 4.6))
    ax = fig.add_subplot()
    measured = [r for r in rows if r.measured]
    predicted = [r for r in rows if not r.measured]
    for group, marker, name in ((predicted, "o", "predicted"), (measured, "s", "measured")):
        if group:
            ax.scatter(
                [r.tokens_per_s for r in group],
                [r.headroom_bytes / _GIB for r in group],
                s=22,
                marker=marker,
                alpha=0.55,
                color="#8c8c8c" if name == "predicted" else "#4c72b0",
                label=f"{name} ({len(group)})",
            )
    if front:
        ax.plot(
            [r.tokens_per_s for r in front],
            [r.headroom_bytes / _GIB for r in front],
            "-o",
            color="#c44e52",
            label="Pareto front",
            markersize=5,
        )
        for i, r in enumerate(front[:10]):  # labels alternate above/below so neighbours do not overprint
            tag = f"trial {r.trial}" + (f"\n${r.dollars_per_mtok:.3f}/Mtok" if r.dollars_per_mtok else "")
            xy, offset = (r.tokens_per_s, r.headroom_bytes / _GIB), (4, 4) if i % 2 == 0 else (4, -20)
            ax.annotate(tag, xy, fontsize=7, xytext=offset, textcoords="offset points")
        ax.margins(x=0.1, y=0.12)
    ax.set_xlabel("tokens/s (measured where measured)")
    ax.xaxis.set_major_formatter(_THOUSANDS)
    ax.set_ylabel("memory headroom per GPU (GiB)")
    ax.set_title("Throughput vs memory headroom", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def history_png(history: Sequence[tuple[int, float, bool]]) -> bytes:
    """Optuna's optimization history: each finished trial's value and the best so far."""
    fig = Figure(figsize=(8, 3.6))
    ax = fig.add_subplot()
    for flag, color, name in ((False, "#8c8c8c", "predicted"), (True, "#4c72b0", "measured")):
        pts = [(n, v) for n, v, m in history if m is flag]
        if pts:
            ax.scatter([n for n, _ in pts], [v for _, v in pts], s=18, color=color, label=name)
    best, line = 0.0, []
    for n, v, _ in history:
        best = max(best, v)
        line.append((n, best))
    if line:
        ax.step(
            [n for n, _ in line], [b for _, b in line], where="post", color="#c44e52", label="best so far"
        )
    ax.set_xlabel("trial")
    ax.set_ylabel("tokens/s")
    ax.yaxis.set_major_formatter(_THOUSANDS)
    ax.set_title("Optimization history", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def importance_png(importances: dict[str, float]) -> bytes:
    fig = Figure(figsize=(7, 0.9 + 0.3 * len(importances)))
    ax = fig.add_subplot()
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names], color="#4c72b0")
    ax.set_xlabel("importance for tokens/s (Optuna)")
    ax.set_title("Parameter importances", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    return png(fig)


def error_png(error: ModelError) -> bytes:
    """Predicted vs measured tokens/s of the measured trials, with the y = x line."""
    fig = Figure(figsize=(5.2, 4.6))
    ax = fig.add_subplot()
    pred = [p for _, p, _ in error.pairs]
    meas = [m for _, _, m in error.pairs]
    ax.scatter(meas, pred, color="#4c72b0", s=24)
    for trial, p, m in error.pairs:
        ax.annotate(str(trial), (m, p), fontsize=7, xytext=(3, 3), textcoords="offset points")
    lo, hi = min(pred + meas) * 0.8, max(pred + meas) * 1.25
    ax.plot([lo, hi], [lo, hi], "--", color="black", linewidth=1, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured tokens/s")
    ax.set_ylabel("predicted tokens/s")
    tau = "n/a" if error.kendall_tau is None else f"{error.kendall_tau:+.2f}"
    ax.set_title(f"Cost model error: MAPE {error.mape:.0%}, Kendall tau {tau}", fontsize=10)
    ax.legend(fontsize=7)
    return png(fig)


def scaling_png(
    title: str,
    counts: Sequence[int],
    tokens_per_s: Sequence[float | None],
    efficiency: Sequence[float | None],
    fractions: Sequence[dict[str, float] | None],
    min_efficiency: float,
) -> bytes:
    """Three panels over GPU counts: throughput vs linear, efficiency vs threshold, step-time shares."""
    fig = Figure(figsize=(14, 4.2))
    ax_t, ax_e, ax_f = fig.subplots(1, 3)
    ok = [(n, t) for n, t in zip(counts, tokens_per_s, strict=True) if t]
    if ok:
        base_n, base_t = ok[0]
        ax_t.plot([n for n, _ in ok], [t for _, t in ok], "-o", color="#4c72b0", label="best plan")
        ax_t.plot(
            [n for n, _ in ok], [base_t * n / base_n for n, _ in ok], "--", color="#8c8c8c", label="linear"
        )
    ax_t.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens/s")
    ax_t.set_title("Throughput", fontsize=10)
    ax_t.legend(fontsize=7)
    eff = [(n, e) for n, e in zip(counts, efficiency, strict=True) if e is not None]
    ax_e.plot([n for n, _ in eff], [e for _, e in eff], "-o", color="#55a868")
    ax_e.axhline(min_efficiency, color="#c44e52", linestyle="--", linewidth=1, label=f"{min_efficiency:.0%}")
    misses = [n for n, t in zip(counts, tokens_per_s, strict=True) if not t]
    if misses:
        ax_e.plot(misses, [0.02] * len(misses), "x", color="#c44e52", label="no plan (see table)")
    top = max([1.0] + [e for _, e in eff]) * 1.1
    ax_e.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency", ylim=(0, top))
    ax_e.set_title("Efficiency vs linear (per-GPU tokens/s)", fontsize=10)
    ax_e.legend(fontsize=7)
    shown = [(n, f) for n, f in zip(counts, fractions, strict=True) if f]
    xs = [str(n) for n, _ in shown]
    bottom = [0.0] * len(shown)
    for color, (label, _) in zip(_COLORS, TIME_GROUPS, strict=True):
        values = [f[label] for _, f in shown]
        if any(values):
            ax_f.bar(xs, values, bottom=bottom, color=color, label=label)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    ax_f.set(xlabel="GPUs", ylabel="share of step time", ylim=(0, 1))
    ax_f.set_title("Where the step goes (best plan)", fontsize=10)
    ax_f.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (ax_t, ax_e):
        ax.minorticks_off()
        ax.set_xticks(list(counts), [str(n) for n in counts])
        ax.grid(alpha=0.3)
    ax_t.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax_t.yaxis.set_major_formatter(_THOUSANDS)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return png(fig)
