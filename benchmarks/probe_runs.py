"""The probe runs behind the calibration results: the committed profiles (results/profiles) and the
repeated ``autotune probe`` runs (results/probe_repeats/N), what each read, and how the fidelity held-out fit
fares with each. Sections of benchmarks/results/calibration_summary.md; reads, never measures.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import yaml

RESULTS = Path(__file__).resolve().parent / "results"
HOST_KEYS = (
    ("op_overhead_us", "host time per eager operator"),
    ("dtensor_op_overhead_us", "per DTensor operator"),
    ("dtensor_collective_overhead_us", "per TP collective via DTensor beyond the direct call"),
)


def load_result(name: str) -> Any:
    """A JSON result file under ``benchmarks/results``, or None where it has not been measured."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def probe_section() -> list[str]:
    lines = ["## 1. Probe (`autotune probe --device cpu --nproc N`)", ""]
    for path in sorted((RESULTS / "profiles").glob("cpu-*.yaml")):
        p = yaml.safe_load(path.read_text())
        s, g = p["summary"], p["gpu_overrides"]
        link = p.get("intra_node_link", {})
        lines += [
            f"**{p['name']}** ({p['measured']}; {p['source']}): best GEMM "
            + ", ".join(f"{k} {v * 1e3:.1f} GFLOP/s" for k, v in s["best_gemm_tflops"].items())
            + f", gemm_efficiency {g['gemm_efficiency']:.2f}; copy {s['copy_gb_s']:.1f} GB/s; all-reduce "
            f"alpha-beta fit {link.get('bw_gb_s', 0):.2f} GB/s, {link.get('latency_us', 0):.0f} us per ring "
            "step. Peak busbw: "
            + ", ".join(f"{k} {v:.2f} GB/s" for k, v in s["peak_busbw_gb_s"].items())
            + "".join(f"; {label} {g[key]:.1f} us" for key, label in HOST_KEYS if key in g)
            + _pipeline_text(g),
            "",
        ]
    return lines


def _pipeline_text(g: dict[str, Any]) -> str:
    actions = g.get("pipeline_action_us")
    return (
        "; per pipeline schedule action " + ", ".join(f"{k} {v:.0f} us" for k, v in actions.items())
        if actions
        else ""
    )


def with_repeats(committed: dict[str, Any], prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """The committed result and those computed from repeated probes (``<prefix>N.json``), named with the day
    the probe ran and its collective sweeps."""
    return [(f"committed profiles {_probe_run(RESULTS / 'profiles')}", committed)] + [
        (f"probe repeat {n} {_probe_run(RESULTS / 'probe_repeats' / n)}", json.loads(p.read_text()))
        for p in sorted(RESULTS.glob(f"{prefix}*.json"))
        for n in [p.stem.removeprefix(prefix)]
    ]


def _probe_run(folder: Path) -> str:
    """``(2026-12-02, 3 sweeps)`` of the 4-rank profile in ``folder``."""
    path = folder / "cpu-4rank.yaml"
    if not path.exists():
        return ""
    doc = yaml.safe_load(path.read_text())
    sweeps = len(doc["measurements"]["collectives"][0].get("sweeps_s") or [0])
    return f"({doc['measured'][:10]}, {sweeps} sweep{'s' * (sweeps > 1)})"


def fidelity_repeat_section(fid: dict[str, Any]) -> list[str]:
    """The probe-profile rows with the committed profiles and with repeated probes (fidelity_probe*.json)."""
    runs = with_repeats(fid, "fidelity_probe")
    if len(runs) < 2:
        return []
    lines = [
        "The same with the profiles of repeated `autotune probe` runs (`python benchmarks/fidelity.py "
        "--profiles DIR --out FILE`; profiles under `results/probe_repeats/`), probe-profile base, "
        "held-out tau / MAPE, median of the splits:",
        "",
        "| cell | " + " | ".join(name for name, _ in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    pairs = probe_pairs(fid)
    for c in (c for c in fid["cells"] if c["base"] != "catalog cpu" and c.get("held_out_splits")):
        cols = [
            f"{s['kendall_tau']['median']:+.2f} / {s['mape']['median']:.1%}" if s else "n/a"
            for s in (pairs.get((c["cell"], name)) for name, _ in runs)
        ]
        lines.append(f"| {c['cell']} | " + " | ".join(cols) + " |")
    return lines + ["", probe_pairs_text(pairs), ""] + probe_drift_table()


def probe_pairs(fid: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(cell, probe run) -> held-out splits of the probe-profile base, committed and repeated probes."""
    return {
        (o["cell"], name): o["held_out_splits"]
        for name, r in with_repeats(fid, "fidelity_probe")
        for o in r["cells"]
        if o["base"] != "catalog cpu" and o.get("held_out_splits")
    }


def probe_pairs_text(pairs: dict[tuple[str, str], dict[str, Any]]) -> str:
    """How many cell x probe pairs meet both targets, the mean and the worst MAPE."""
    if not pairs:
        return ""
    ok, mean, (cell, probe, worst) = pairs_stats(pairs)
    return (
        f"{ok} of {len(pairs)} cell x probe pairs meet both targets (tau >= 0.8 and MAPE <= 10 %); mean "
        f"MAPE {mean:.1%}, worst {worst:.1%} ({cell}, {probe})."
    )


def pairs_stats(pairs: dict[tuple[str, str], dict[str, Any]]) -> tuple[int, float, tuple[str, str, float]]:
    """(pairs meeting both targets, mean MAPE, (cell, probe run, MAPE) of the worst)."""
    ok = sum(s["kendall_tau"]["median"] >= 0.8 and s["mape"]["median"] <= 0.10 for s in pairs.values())
    (cell, probe), worst = max(pairs.items(), key=lambda kv: kv[1]["mape"]["median"])
    mean = statistics.fmean(s["mape"]["median"] for s in pairs.values())
    return ok, mean, (cell, probe.split(" (")[0], worst["mape"]["median"])


def probe_drift_table() -> list[str]:
    """What each probe read on 4 ranks: a probe describes the machine on the day it ran."""
    folders = [RESULTS / "profiles"] + sorted((RESULTS / "probe_repeats").glob("*"))
    days = sorted({c["first_run"][:10] for c in (load_result("landscape_meta.json") or {}).get("cells", [])})
    lines = [
        "What the probes read on 4 ranks. A probe describes the machine when it ran; the landscape "
        f"was measured on {' and '.join(days) or '?'} (section 2). A profile of another day prices the "
        "landscape with that day's host "
        "times, which the fit can move only together (one host scale). The DTensor collective column is "
        "the extra host time of a TP collective issued through DTensor, the median of the three kinds "
        "that the model charges, and in brackets all-gather / reduce-scatter / all-reduce, which do not "
        "keep their order from probe to probe.",
        "",
        "| probe | measured | sweeps | host us / op | us / DTensor op | DTensor collective extra us | "
        "1F1B action us | all-reduce alpha us | GEMM peak GFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for folder in folders:
        path = folder / "cpu-4rank.yaml"
        if not path.exists():
            continue
        doc = yaml.safe_load(path.read_text())
        g = doc["gpu_overrides"]
        sweeps = len(doc["measurements"]["collectives"][0].get("sweeps_s") or [0])
        name = "committed" if folder.name == "profiles" else f"repeat {folder.name}"
        lines.append(
            f"| {name} | {doc['measured']} | {sweeps} | {g['op_overhead_us']:.1f} | "
            f"{g['dtensor_op_overhead_us']:.0f} | "
            f"{_dtensor_collective_text(doc)} | "
            f"{g['pipeline_action_us']['1f1b']:.0f} | {doc['intra_node_link']['latency_us']:.0f} | "
            f"{g['fp32_tflops'] * 1e3:.1f} |"
        )
    return lines + [""]


def _dtensor_collective_text(doc: dict[str, Any]) -> str:
    extra = doc["measurements"]["op_overhead"]["dtensor_collective_extra_s"]
    kinds = " / ".join(
        f"{max(0.0, extra[k]) * 1e6:.0f}" for k in ("all_gather", "reduce_scatter", "all_reduce")
    )
    return f"{doc['gpu_overrides']['dtensor_collective_overhead_us']:.0f} ({kinds})"
