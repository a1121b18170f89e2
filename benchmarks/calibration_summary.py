"""benchmarks/results/calibration_summary.md and the README's performance table, from the committed results.

Reads (never measures): profiles/cpu-*rank.yaml (``autotune probe``), landscape_meta.json +
landscape_*.jsonl (benchmarks/landscape.py), fidelity.json (fidelity.py), search_replay.json
(search_replay.py), llm_analysis_compare.json (llm_analysis_compare.py), ds_autotuning.json
(ds_autotuning.py); the probe sections and the repeated-probe rows are in probe_runs.py.
The README block between ``<!-- calibration:begin -->`` and ``<!-- calibration:end -->`` is replaced.

Usage:  python benchmarks/calibration_summary.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks.landscape import CELLS, CUTS, load_landscape, result_path  # noqa: E402
from benchmarks.probe_runs import (  # noqa: E402
    RESULTS,
    fidelity_repeat_section,
    load_result,
    pairs_stats,
    probe_pairs,
    probe_section,
    with_repeats,
)

BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"
STRATEGIES = ("autotune", "autotune_profile", "autotune_recalibrate", "tpe", "random", "grid", "deepspeed")


def _tau(d: dict[str, Any] | None) -> str:
    if not d or d.get("kendall_tau") is None:
        return "n/a"
    return f"{d['kendall_tau']:+.2f} / {d['mape']:.0%}"


def _repeats(meta: dict[str, Any]) -> str:
    """Repeats per plan x measured steps per run, per group of cells where they differ."""

    def runs(c: dict[str, Any]) -> str:
        steps = c.get("measure_steps", meta.get("measure_steps", 8))
        return f"{c.get('repeats', meta.get('repeats', 2))} repeats x {steps}"

    per_cell = {c["cell"]: runs(c) for c in meta["cells"]}
    kinds = sorted(set(per_cell.values()))
    if len(kinds) <= 1:
        return kinds[0] if kinds else runs({})
    return " / ".join(f"{k} ({', '.join(c for c, v in per_cell.items() if v == k)})" for k in kinds)


def landscape_section() -> list[str]:
    meta = load_result("landscape_meta.json") or {"cells": []}
    by_cell = {c["cell"]: c for c in meta["cells"]}
    cuts = "; ".join(f"{k}: {[getattr(v, 'value', v) for v in vs]}" for k, vs in CUTS.items())
    lines = [
        "## 2. Measured landscape (`python benchmarks/landscape.py`)",
        "",
        f"Global batch 2 sequences per rank x seq-len {meta.get('seq_len', 64)}, "
        f"{meta.get('warmup_steps', 2)} warm-up steps, then {_repeats(meta)} measured steps per run "
        f"(repeats in passes, every other one in reverse order). Cut dimensions: {cuts} "
        "(reasons in landscape.py). Measured step time = median over repeats of each run's median step. "
        "Every plan runs through the trial worker's own run_trial (benchmarks/_landscape_worker.py) in its "
        "own torchrun launch, as autotune search runs a trial (a process that ran trials one after another "
        "kept every trial's gloo groups and their threads and slowed with each, and DeepSpeed plans read "
        "slower after other engines: landscape.py `_next_launch`). Earlier runs are in git history: under "
        "load 8-75 (commit e90278c), the torchrun cells batched per launch (commit e1dfd7a), the DeepSpeed "
        "cells batched per launch (commit a6f201b).",
        "",
        "| cell | legal plans | measured ok (>= 2 repeats) | failed | not measured | runs "
        "| measured from - to | load avg (1 min) min / median / max | best plan | best step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        if not result_path(cell).exists():
            lines.append(f"| {cell} | | | | all (budget) | | | | | |")
            continue
        rows = load_landscape(cell)
        ok = [r for r in rows if r["status"] == "ok"]
        failed = [r for r in rows if r["status"] not in ("ok", "not_measured")]
        c = by_cell.get(cell, {})
        load = c.get("load_avg_1min", {})
        best = min(ok, key=lambda r: r["step_time_s"]) if ok else None
        best_txt = _plan_text(best["plan"]) if best else ""
        lines.append(
            f"| {cell} | {c.get('num_legal', len(rows))} | {len(ok)} "
            f"({sum(len(r['runs']) >= 2 for r in ok)}) | "
            f"{len(failed)} | {sum(r['status'] == 'not_measured' for r in rows)} | {c.get('num_runs', '')} | "
            f"{c.get('first_run', '')[5:16]} - {c.get('last_run', '')[11:16]} | "
            f"{load.get('min', 0):.1f} / {load.get('median', 0):.1f} / {load.get('max', 0):.1f} | "
            f"{best_txt} | {best['step_time_s'] * 1e3:.0f} ms |"
            if best
            else "| |"
        )
    return lines + [""]


def _plan_text(p: dict[str, Any]) -> str:
    extra = (
        [p["sharding"]]
        + (["SP"] if p["sequence_parallel"] else [])
        + (
            [p["schedule"] + (f"/v{p['virtual_stages']}" if p["virtual_stages"] > 1 else "")]
            if p["pp"] > 1
            else []
        )
    )
    return f"TP{p['tp']} PP{p['pp']} DP{p['dp']} mbs{p['micro_batch']} " + " ".join(extra)


def fidelity_section() -> list[str]:
    fid = load_result("fidelity.json") or {"cells": []}
    lines = [
        "## 3. Fidelity: Kendall tau / MAPE of step time (`python benchmarks/fidelity.py`)",
        "",
        "Fit on a random half of each cell's plans, reported on that half and on the held-out half; "
        "'fit all' fits every plan; the repeat ceiling is repeat 1 against repeat 2 of the same plans "
        "(with 4 or 8 repeats, the median of the first half of them against that of the second). "
        "Targets: tau >= 0.8 and MAPE <= 10 % after calibration. Fitted factors no plan depends on are "
        "left out (on the CPU device no collective overlaps compute, so the DP overlap has no effect there). "
        "The extra factors enter only where the AIC asks for them and the fit does not end on a search limit "
        "(autotune/calibrate/fit.py); `shared_core_latency` is the share of a ring step's latency that waits "
        "for the node's other groups of the same axis when 4 ranks share 2 cores "
        "(autotune/costmodel/comm.py; the catalog `cpu` base has no core count, so it does not apply there).",
        "",
        "| cell | base model | before (held-out) | after, fitted half | after, held-out | "
        f"held-out, median of {fid.get('splits', 0)} splits [range] | fit all | repeat ceiling | "
        "fitted factors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in fid["cells"]:
        f = c["factors"]
        factors = ", ".join(_factor(k, f[k]) for k in c["fitted"] if k not in c.get("unidentified", ()))
        lines.append(
            f"| {c['cell']} | {c['base']} | {_tau(c['before_held_out'])} | {_tau(c['after_fit_half'])} "
            f"| {_tau(c['after_held_out'])} | {_splits(c.get('held_out_splits'))} | "
            f"{_tau(c['after_all_fit_all'])} | "
            f"{_tau(c['repeat_ceiling'])} | {factors} |"
        )
    return lines + [""] + fidelity_repeat_section(fid)


def _splits(d: dict[str, Any] | None) -> str:
    if not d:
        return "n/a"
    t, m = d["kendall_tau"], d["mape"]
    return (
        f"{t['median']:+.2f} / {m['median']:.1%} [{t['min']:+.2f}..{t['max']:+.2f} / "
        f"{m['min']:.0%}..{m['max']:.0%}]"
    )


def _factor(name: str, value: float) -> str:
    if name.endswith("_s"):
        return f"{name.removesuffix('_s')} {value * 1e3:.1f} ms"
    return (
        f"{name.removesuffix('_efficiency').removesuffix('_fraction')} {value:.2g}"
        if value > 1e-6
        else f"{name.removesuffix('_efficiency').removesuffix('_fraction')} 0"
    )


def replay_section() -> list[str]:
    rep = load_result("search_replay.json") or {"cells": []}
    lines = [
        "## 4. Search efficiency on the landscape (`python benchmarks/search_replay.py`)",
        "",
        f"Trials until a plan within {rep.get('within', 0.05):.0%} of the landscape's best is measured "
        f"(median over {rep.get('seeds', 20)} seeds; trial-seconds in brackets; grid and DeepSpeed are "
        "deterministic). Target: autotune <= 25 % of grid's trials, median <= 3.",
        "",
        "| cell | space | plans | within 5 % | "
        + " | ".join(STRATEGIES)
        + " | autotune / grid | autotune_profile / grid |",
        "|---|---|---|---|" + "---|" * (len(STRATEGIES) + 2),
    ]
    for c in rep["cells"]:
        cols = []
        for s in STRATEGIES:
            v = c.get(s)
            cols.append(
                ""
                if v is None
                else "never"
                if v["median_trials"] == float("inf")
                else f"{_num(v['median_trials'])} ({_num(v['median_trial_s'])} s)"
            )
        ratios = [
            f"{c[k]['median_trials'] / c['grid']['median_trials']:.0%}" if c.get(k) else ""
            for k in ("autotune", "autotune_profile")
        ]
        lines.append(
            f"| {c['cell']} | {c['space']} | {c['num_plans']} | {c['num_good']} | "
            + " | ".join(cols)
            + f" | {' | '.join(ratios)} |"
        )
    return lines + [""] + probe_repeat_section(rep)


def probe_repeat_section(rep: dict[str, Any]) -> list[str]:
    """``autotune_profile`` with the committed profiles and with repeated probes
    (search_replay_probe*.json)."""
    runs = with_repeats(rep, "search_replay_probe")
    if len(runs) < 2:
        return []
    profiles = [*RESULTS.glob("profiles/cpu-*.yaml"), *RESULTS.glob("probe_repeats/*/cpu-*.yaml")]
    effs = sorted(yaml.safe_load(p.read_text())["gpu_overrides"]["gemm_efficiency"] for p in profiles)
    lines = [
        f"The probe is noisy on this VM (GEMM efficiency {effs[0]:.2f}-{effs[-1]:.2f} over the "
        "committed and the repeated probes): the same replay with profiles from repeated `autotune "
        "probe` runs (`python "
        "benchmarks/search_replay.py --profiles DIR --out FILE`; profiles under "
        "`results/probe_repeats/`), `autotune_profile` trials and / grid:",
        "",
        "| cell | space | " + " | ".join(name for name, _ in runs) + " |",
        "|---|---|" + "---|" * len(runs),
    ]
    for i, c in enumerate(rep["cells"]):
        cols = []
        for _, r in runs:
            other = r["cells"][i]
            t = other["autotune_profile"]["median_trials"]
            cols.append(f"{_num(t)} ({t / other['grid']['median_trials']:.0%})")
        lines.append(f"| {c['cell']} | {c['space']} | " + " | ".join(cols) + " |")
    return lines + [""]


def _num(x: float) -> str:
    return "never" if x == float("inf") else f"{x:.0f}" if x >= 10 or x == int(x) else f"{x:.1f}"


def llm_analysis_section() -> list[str]:
    cmp = load_result("llm_analysis_compare.json")
    if not cmp:
        return []
    s = cmp["stats"]
    lines = [
        "## 5. Published runs: autotune vs llm-analysis (`python benchmarks/llm_analysis_compare.py`)",
        "",
        f"Same {s['rows']} rows of benchmarks/published_runs.py "
        f"(llm-analysis ran {s['rows_llm_analysis_ran']})."
        f" Median |error| of throughput: **autotune {s['autotune_median_abs_error_common']:.1%}**, "
        f"llm-analysis with autotune's efficiencies {s['llm_analysis_median_abs_error_common']:.1%}, "
        f"llm-analysis as shipped (peak efficiency) {s['llm_analysis_peak_median_abs_error_common']:.1%}.",
        "",
        "| row | metric | measured | autotune | err | llm-analysis | err | as shipped err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in cmp["rows"]:
        if r["excluded"]:
            continue
        la = "refused" if r["llm_analysis"] is None else f"{r['llm_analysis']:.4g}"
        err = "" if r["llm_analysis_error"] is None else f"{r['llm_analysis_error']:+.0%}"
        peak = "" if r["llm_analysis_peak_error"] is None else f"{r['llm_analysis_peak_error']:+.0%}"
        lines.append(
            f"| {r['id']} | {r['metric']} | {r['measured']:.4g} | {r['autotune']:.4g} | "
            f"{r['autotune_error']:+.0%} | {la} | {err} | {peak} |"
        )
    return lines + [""]


def deepspeed_section() -> list[str]:
    h2h = load_result("ds_autotuning.json")
    if not h2h:
        return [
            "## 6. DeepSpeed Autotuning head to head",
            "",
            "Not run yet (`python benchmarks/ds_autotuning.py`).",
            "",
        ]
    lines = [
        "## 6. DeepSpeed Autotuning head to head (`python benchmarks/ds_autotuning.py`)",
        "",
        f"{h2h['model']}, {h2h['nproc']} gloo ranks, global batch {h2h['global_batch']} x {h2h['seq_len']} "
        f"tokens, ZeRO stage x micro-batch; load average {h2h['load_before']} -> {h2h['load_after']}.",
        "",
        "| tuner | wall time to answer | experiments / trials | answer | measured tokens/s (median) |",
        "|---|---|---|---|---|",
    ]
    for name in ("deepspeed", "autotune"):
        r = h2h[name]
        n = r.get("experiments") or (r.get("trials") or {}).get("launched_this_run", "")
        ans = r.get("answer")
        ans_txt = f"ZeRO-{ans['zero_stage']} mbs {ans['micro_batch']}" if ans else "none"
        tps = (h2h.get("measured", {}).get(name) or {}).get("median_tokens_per_s")
        lines.append(f"| {name} | {r['wall_s']:.0f} s | {n} | {ans_txt} | {tps or 0:,.0f} |")
    return lines + [""]


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
            f"{_num(med[0])} - {_num(med[-1])} ({met} of {len(med)} cells <= 3) |",
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


def main() -> None:
    lines = [
        "# Calibrate and prove: results on this machine's CPU",
        "",
        "Generated by `python benchmarks/calibration_summary.py` from the result files beside it. "
        "The machine has 2 CPU cores (a VM). Every measurement carries its load average; on 4 ranks the load "
        "is mostly the trial's own ranks and their gloo threads time-sharing the 2 cores.",
        "",
    ]
    lines += probe_section() + landscape_section() + fidelity_section() + replay_section()
    lines += llm_analysis_section() + deepspeed_section()
    (RESULTS / "calibration_summary.md").write_text("\n".join(lines) + "\n")
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        readme.write_text(head + readme_block() + rest.split(END, 1)[1])
    print(RESULTS / "calibration_summary.md")


if __name__ == "__main__":
    main()
