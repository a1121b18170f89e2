"""The README's performance table (between ``<!-- calibration:begin -->`` and ``<!-- calibration:end -->``):
each claim, its target and what the committed results measure; calibration_summary.py writes it.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.probe_runs import load_result, pairs_stats, probe_pairs

__all__ = ["count_text", "readme_block", "replace_readme_block"]

BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"


def count_text(x: float) -> str:
    """A median count of trials (or seconds) as the tables show it: ``never`` when none got there."""
    return "never" if x == float("inf") else f"{x:.0f}" if x >= 10 or x == int(x) else f"{x:.1f}"


def readme_block() -> str:
    fid = load_result("fidelity.json") or {"cells": []}
    rep = load_result("search_replay.json") or {"cells": []}
    cmp = load_result("llm_analysis_compare.json")
    h2h = load_result("ds_autotuning.json")
    catalog = [c for c in fid["cells"] if c["base"] == "catalog cpu"]
    lines = [
        BEGIN,
        "",
        "| claim (full tables: benchmarks/results/calibration_summary.md) | target | measured |",
        "|---|---|---|",
    ]
    profiled = [c for c in fid["cells"] if c["base"] != "catalog cpu" and not c["cell"].startswith("h200")]
    for cells, how in ((catalog, "catalog `cpu` base"), (profiled, "probe-profile base")):
        if not cells:
            continue
        taus = sorted(c["after_held_out"]["kendall_tau"] or 0 for c in cells)
        mapes = sorted(c["after_held_out"]["mape"] for c in cells)
        ceil = sorted(
            c["repeat_ceiling"]["kendall_tau"]
            for c in cells
            if c["repeat_ceiling"]["kendall_tau"] is not None
        ) or [0.0]
        ceil_mape = sorted(
            c["repeat_ceiling"]["mape"] for c in cells if c["repeat_ceiling"]["mape"] is not None
        )
        lines += [
            f"| CPU landscape, {how}: step-time Kendall tau after calibration, held-out, per cell | >= 0.8 | "
            f"{taus[0]:.2f} - {taus[-1]:.2f} ({sum(t >= 0.8 for t in taus)} of {len(taus)} cells; "
            f"repeat-vs-repeat ceiling {ceil[0]:.2f} - {ceil[-1]:.2f}) |",
            f"| CPU landscape, {how}: step-time MAPE after calibration, held-out | <= 10 % | "
            f"{mapes[0]:.1%} - {mapes[-1]:.1%} ({sum(m <= 0.10 for m in mapes)} of {len(mapes)} cells; "
            f"repeat-vs-repeat {ceil_mape[0]:.0%} - {ceil_mape[-1]:.0%}) |",
        ]
        split = [c["held_out_splits"] for c in cells if c.get("held_out_splits")]
        if split:
            st = sorted(x["kendall_tau"]["median"] for x in split)
            sm = sorted(x["mape"]["median"] for x in split)
            lines.append(
                f"| CPU landscape, {how}: held-out tau / MAPE, median of {split[0]['splits']} random splits "
                f"per cell | >= 0.8 / <= 10 % | tau {st[0]:.2f} - {st[-1]:.2f} "
                f"({sum(t >= 0.8 for t in st)} of {len(st)}); MAPE {sm[0]:.1%} - {sm[-1]:.1%} "
                f"({sum(m <= 0.10 for m in sm)} of {len(sm)}) |"
            )
    pairs = probe_pairs(fid)
    if len({probe for _, probe in pairs}) > 1:
        ok, mean, (cell, probe, worst) = pairs_stats(pairs)
        runs = sorted({probe for _, probe in pairs})
        day = re.compile(r"\d{4}-\d\d-\d\d")
        days = {m.group() for m in map(day.search, runs) if m}
        lines.append(
            f"| CPU landscape, probe-profile base, each of {len(runs)} probe runs "
            f"({len(days)} days): held-out tau / MAPE, median of the splits, per cell "
            f"| >= 0.8 / <= 10 % | {ok} of {len(pairs)} cell x probe pairs; mean MAPE {mean:.1%}, "
            f"worst {worst:.1%} ({cell}, {probe}) |"
        )
    for c in (c for c in fid["cells"] if c["cell"].startswith("h200")):
        lines += [
            f"| {c['cell']}: held-out MAPE before -> after the fit | | {c['before_held_out']['mape']:.0%} -> "
            f"{c['after_held_out']['mape']:.0%} (tau {c['after_held_out']['kendall_tau']:+.2f}) |",
        ]
    full = [c for c in rep["cells"] if c["space"] == "full"]
    for key, how in (("autotune", "catalog `cpu` entry"), ("autotune_profile", "probe `--profile`")):
        if not full or key not in full[0]:
            continue
        med = sorted(c[key]["median_trials"] for c in full)
        ratio = sorted(c[key]["median_trials"] / c["grid"]["median_trials"] for c in full)
        met = sum(m <= 3 for m in med)
        lines += [
            f"| trials to within 5 % of best (median over seeds, per cell), {how} | <= 3 | "
            f"{count_text(med[0])} - {count_text(med[-1])} ({met} of {len(med)} cells <= 3) |",
            f"| autotune trials / NeMo-order grid trials, {how} | <= 25 % | "
            f"{ratio[0]:.0%} - {ratio[-1]:.0%} |",
        ]
    if cmp:
        s = cmp["stats"]
        lines.append(
            f"| published runs, median abs error ({s['rows']} rows) | below llm-analysis | autotune "
            f"{s['autotune_median_abs_error_common']:.1%}, llm-analysis "
            f"{s['llm_analysis_median_abs_error_common']:.1%} |"
        )
    if h2h and h2h.get("measured"):
        m = h2h["measured"]
        lines.append(
            f"| vs DeepSpeed Autotuning: wall time, measured tokens/s of its pick | | autotune "
            f"{h2h['autotune']['wall_s']:.0f} s, "
            f"{(m.get('autotune') or {}).get('median_tokens_per_s') or 0:,.0f}"
            f"; DeepSpeed {h2h['deepspeed']['wall_s']:.0f} s, "
            f"{(m.get('deepspeed') or {}).get('median_tokens_per_s') or 0:,.0f} |"
        )
    return "\n".join(
        lines
        + [
            "",
            "Regenerate: `python benchmarks/calibration_summary.py` (from the committed "
            "results; each result file names the command that measures it).",
            "",
            END,
        ]
    )


def replace_readme_block(readme: Path) -> None:
    """Replace the block between the markers in ``readme`` (nothing when it has none)."""
    text = readme.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        readme.write_text(head + readme_block() + rest.split(END, 1)[1])
