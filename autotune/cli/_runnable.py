"""When the best plan's own launch file cannot be written for this model (Megatron-LM's flags cannot build
gpt-oss's biased experts, Llama 4's chunked attention, ...), the best ranked plan whose file can, written
beside it in ``best_runnable/`` so a search always leaves something to launch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.costmodel import Estimate
from autotune.plan import ParallelPlan
from autotune.render import plan_summary
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["runnable_fallback", "RUNNABLE_DIR"]

RUNNABLE_DIR = "best_runnable"
_MAX_WALK = 100_000
"""Ranked plans looked at for one whose file can be written (each look is a few pure checks)."""


def runnable_fallback(
    best: ParallelPlan,
    best_tokens_per_s: float,
    ranking: Any,
    model: ModelSpec,
    cluster: ClusterSpec,
    root: Path,
) -> dict[str, Any]:
    """``{}`` when ``best``'s own file is written (``best_tokens_per_s``: its prediction, what the fallback is
    compared with); else ``not_written`` (file -> reasons) and, when a ranked
    plan's file can be written, ``runnable``: that plan, its prediction and the files written for it in
    ``root/best_runnable`` (a stale folder from an earlier run is removed either way), which the best plan's
    ``summary.md`` then names."""
    from autotune.emit import emit_all, own_file_unsupported, remove_emitted

    out_dir = root / RUNNABLE_DIR
    remove_emitted(out_dir)
    name, reasons = own_file_unsupported(best, model)
    if not reasons:
        return {}
    found: Estimate | None = next(
        (e for e in ranking.feasible[:_MAX_WALK] if not own_file_unsupported(e.plan, model)[1]), None
    )
    out: dict[str, Any] = {"not_written": {name: reasons}, "runnable": None}
    if found is not None:
        out["runnable"] = {
            "plan": found.plan.to_dict(),
            "summary": plan_summary(found.plan),
            "rank": ranking.feasible.index(found) + 1,
            "predicted_tokens_per_s": found.tokens_per_s,
            "emitted": [str(p) for p in emit_all(found.plan, model, cluster, found, out_dir, force=True)],
        }
        _note_in_summary(root / "best" / "summary.md", out["runnable"], best_tokens_per_s)
    return out


def _note_in_summary(summary: Path, runnable: dict[str, Any], best_tokens_per_s: float) -> None:
    """Point the best plan's ``summary.md`` (written by ``emit_all``) at the plan it can launch instead."""
    if not summary.exists():
        return
    gap = runnable["predicted_tokens_per_s"] / best_tokens_per_s - 1
    summary.write_text(
        summary.read_text().rstrip("\n")
        + f"\n\n## Runnable instead\n\nThe best ranked plan whose own launch file autotune writes is "
        f"#{runnable['rank']}, `{runnable['summary']}`, {runnable['predicted_tokens_per_s']:,.0f} tokens/s "
        f"predicted ({gap:+.0%}): its files are in `../{RUNNABLE_DIR}/`.\n"
    )
