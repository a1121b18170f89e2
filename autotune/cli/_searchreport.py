"""``autotune search``'s output: the ``--json`` object and the text report around the best plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.costmodel import Estimate
from autotune.headroom import room_left
from autotune.plan import ParallelPlan
from autotune.render import gib, params_line, plan_summary
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trialrecord import record_of

__all__ = ["search_report", "search_summary", "trial_row"]


def search_summary(
    best: Estimate,
    top: list[Any],
    study: Any,
    url: str,
    ranking: Any,
    emitted: list[str] | None,
    launched: int,
    measured: bool,
    note: str | None,
) -> dict[str, Any]:
    """The ``--json`` object: the best plan's estimate (as ``estimate --json``) plus the search around it."""
    records = [record_of(t) for t in study.trials]
    states = [r.shown_status for r in records]
    return {
        **best.to_dict(),
        "study": study.study_name,
        "storage": url,
        "backend_note": note,
        "value_source": "measured" if measured else "predicted",
        "best_trial": top[0].number,
        "best_value_tokens_per_s": top[0].value,
        "trials": {
            "total": len(states),
            "launched_this_run": launched,
            "ok": states.count("ok"),
            "infeasible": states.count("infeasible"),
            "failed": sum(r.failed for r in records),
        },
        "num_legal_plans": ranking.num_legal,
        "num_feasible_plans": len(ranking.feasible),
        "pruned_by_reason": ranking.pruned,
        "emitted": emitted if emitted is not None else [],
        "emit_available": emitted is not None,
        "memory_headroom": ranking.ctx.memory_headroom,
        "memory_room_left": room_left(best),
        "top": [trial_row(t) for t in top],
    }


def trial_row(trial: Any) -> dict[str, Any]:
    record = record_of(trial)
    predicted, measured = record.predicted, record.measured
    return {
        "trial": trial.number,
        "plan": record.plan,
        "status": record.status,
        "tokens_per_s": trial.value,
        "predicted_tokens_per_s": predicted.get("tokens_per_s"),
        "measured_tokens_per_s": measured.get("tokens_per_s"),
        "mfu": measured.get("mfu", predicted.get("mfu")),
        "memory_bytes_per_gpu": measured.get("peak_memory_bytes", predicted.get("memory_bytes_per_gpu")),
        "memory_capacity_bytes": predicted.get("memory_capacity_bytes"),
        "predicted_memory_bytes": predicted.get("memory_bytes_per_gpu"),
        "measured_memory_bytes": measured.get("peak_memory_bytes"),
        "bottleneck": predicted.get("bottleneck"),
    }


def search_report(out: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, ranking: Any) -> str:
    ctx = ranking.ctx
    lines = [
        f"model     {model.name} ({params_line(model)}) on {cluster.name}",
        f"batch     {ctx.global_batch} sequences x {ctx.seq_len} tokens per step",
        f"space     {out['num_legal_plans']:,} legal plans, {out['num_feasible_plans']:,} fit; "
        "combinations pruned, by reason:",
    ]
    lines += [f"  {n:>12,}  {reason}" for reason, n in out["pruned_by_reason"].items()]
    trials = out["trials"]
    lines += [
        f"study     {out['study']} ({out['storage']}): {trials['total']} trials, "
        f"{trials['launched_this_run']} launched now, {trials['infeasible']} infeasible proposals "
        "never launched",
        "",
    ]
    lines += _table(out["top"], measured=out["value_source"] == "measured")
    best = ParallelPlan.from_dict(out["plan"])
    lines += [
        "",
        f"best      {plan_summary(best)}",
        f"memory    {out['memory_room_left']} (headroom asked: {out['memory_headroom']:.0%})",
    ]
    if out["emit_available"]:
        lines += [f"emitted   {path}" for path in out["emitted"]]
        lines += _runnable_lines(out)
    else:
        lines.append("emitted   nothing yet: autotune.emit is not installed (launch files come with it)")
    if cluster.profile:
        lines.append(f"hardware  {cluster.profile}")
    if out.get("calibration"):
        c = out["calibration"]
        lines.append(
            f"calibration  Kendall tau {_tau(c['before'])} -> {_tau(c['after'])}, MAPE "
            f"{c['before']['mape']:.0%} -> {c['after']['mape']:.0%} over {c['num_trials']} trials "
            f"({c['path']}; autotune calibrate --study {out['study']} for every trial)"
        )
    return "\n".join(lines)


def _tau(fidelity: dict[str, Any]) -> str:
    return "n/a" if fidelity["kendall_tau"] is None else f"{fidelity['kendall_tau']:+.2f}"


def _table(rows: list[dict[str, Any]], *, measured: bool) -> list[str]:
    plans = [plan_summary(ParallelPlan.from_dict(row["plan"])) for row in rows]
    width = max(len(p) for p in plans)
    head = (
        f"{'#':>3}  {'plan':<{width}}  "
        + (f"{'meas tok/s':>10} " if measured else "")
        + f"{'pred tok/s':>10} {'MFU':>6}  {'memory/GPU':<21} {'binds':<26} status"
    )
    lines = [head]
    for i, (row, plan) in enumerate(zip(rows, plans, strict=True), start=1):
        mem = f"{gib(row['memory_bytes_per_gpu'])} / {gib(row['memory_capacity_bytes'])}"
        meas = f"{row['measured_tokens_per_s'] or 0:>10,.0f} " if measured else ""
        lines.append(
            f"{i:>3}  {plan:<{width}}  {meas}{row['predicted_tokens_per_s']:>10,.0f} "
            f"{row['mfu']:>6.1%}  {mem:<21} {row['bottleneck']:<26} {row['status']}"
        )
    return lines


def _runnable_lines(out: dict[str, Any]) -> list[str]:
    """The best plan's own file not written, and the best ranked plan whose file is (``cli._runnable``)."""
    lines = [f"not written  {name}: {'; '.join(why)}" for name, why in out.get("not_written", {}).items()]
    runnable = out.get("runnable")
    if lines and runnable is None:
        lines.append(
            "runnable  no ranked plan's own file can be written for this model (summary.md says why)"
        )
    elif runnable:
        gap = runnable["predicted_tokens_per_s"] / out["tokens_per_s"] - 1
        lines.append(
            f"runnable  #{runnable['rank']} {runnable['summary']}  {runnable['predicted_tokens_per_s']:,.0f} "
            f"tokens/s predicted ({gap:+.0%}), the best plan whose own files are written: "
            f"{Path(runnable['emitted'][0]).parent}"
        )
    return lines
