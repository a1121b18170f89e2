"""benchmarks/results/calibration_summary.md and the README's performance table, from the committed results.

Reads (never measures): profiles/cpu-*rank.yaml (``autotune probe``), landscape_meta.json +
landscape_*.jsonl (benchmarks/landscape.py), fidelity.json (fidelity.py), search_replay.json
(search_replay.py), llm_analysis_compare.json (llm_analysis_compare.py), ds_autotuning.json
(ds_autotuning.py); the probe sections and the repeated-probe rows are in probe_runs.py.
The README block between ``<!-- calibration:begin -->`` and ``<!-- calibration:end -->`` is replaced
(``_calibration_readme.py``).

Usage:  python benchmarks/calibration_summary.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root, for benchmarks.*
from benchmarks._calibration_readme import count_text, replace_readme_block  # noqa: E402
from benchmarks.landscape import CELLS, CUTS, load_landscape, result_path  # noqa: E402
from benchmarks.probe_runs import (  # noqa: E402
    RESULTS,
    fidelity_repeat_section,
    load_result,
    probe_section,
    with_repeats,
)

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
                else f"{count_text(v['median_trials'])} ({count_text(v['median_trial_s'])} s)"
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
            cols.append(f"{count_text(t)} ({t / other['grid']['median_trials']:.0%})")
        lines.append(f"| {c['cell']} | {c['space']} | " + " | ".join(cols) + " |")
    return lines + [""]


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
    replace_readme_block(ROOT / "README.md")
    print(RESULTS / "calibration_summary.md")


if __name__ == "__main__":
    main()
