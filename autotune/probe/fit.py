"""A probe's raw record (``autotune.probe.worker``) as a profile mapping: the GEMM efficiency, alpha-beta fits
of the collectives, and a summary of what was measured (``probe_profile``; ``profile`` writes and reads it).
"""

from __future__ import annotations

import statistics
from typing import Any

from autotune.costmodel.steptime import HBM_EFFICIENCY
from autotune.probe.profile import PER_OP
from autotune.specs import GPUSpec

__all__ = ["fit_alpha_beta", "probe_profile"]

_RING = {  # collective -> (ring steps, bus-bandwidth factor) for n ranks: costmodel/comm.py
    "all_reduce": (lambda n: 2 * (n - 1), lambda n: 2 * (n - 1) / n),
    "all_gather": (lambda n: n - 1, lambda n: (n - 1) / n),
    "reduce_scatter": (lambda n: n - 1, lambda n: (n - 1) / n),
}


def fit_alpha_beta(points: list[dict[str, Any]]) -> tuple[float, float]:
    """(alpha seconds per ring step, bandwidth bytes/s) of ``t = steps alpha + factor S / B`` over points of
    one collective (all-reduce: ``2(n-1)`` steps and ``2(n-1)/n``, costmodel/comm.py's ring; all-gather and
    reduce-scatter ``n-1`` and ``(n-1)/n``), by non-negative least squares on relative residuals (every size
    weighs the same)."""
    import numpy as np
    from scipy.optimize import nnls

    steps, factor = _RING[points[0].get("op", "all_reduce")]
    rows = [[steps(p["num_ranks"]), factor(p["num_ranks"]) * p["size_bytes"]] for p in points]
    times = np.array([p["time_s"] for p in points])
    (alpha, inv_bw), _ = nnls(np.array(rows) / times[:, None], np.ones(len(points)))
    return float(alpha), float(1.0 / inv_bw) if inv_bw > 0 else float("inf")


def _link_fit(raw: dict[str, Any], scope: str, per: int, op: str = "all_reduce") -> dict[str, float] | None:
    points = [c for c in raw["collectives"] if c["op"] == op and c["scope"] == scope]
    if not points:
        return None
    alpha, bw = fit_alpha_beta(points)
    return {"bw_gb_s": round(bw / per / 1e9, 4), "latency_us": round(alpha * 1e6, 2)}


def _summary(raw: dict[str, Any]) -> dict[str, Any]:
    best: dict[str, float] = {}
    for g in raw["gemm"]:
        best[g["dtype"]] = max(best.get(g["dtype"], 0.0), g["flops_per_s"] / 1e12)
    busbw: dict[str, float] = {}
    for c in raw["collectives"]:
        key = f"{c['scope']} {c['op']}"
        busbw[key] = max(busbw.get(key, 0.0), c["busbw_bytes_per_s"] / 1e9)
    out = {
        "best_gemm_tflops": {k: round(v, 4) for k, v in best.items()},
        "copy_gb_s": round(raw["copy_bytes_per_s"] / 1e9, 3),
        "peak_busbw_gb_s": {k: round(v, 4) for k, v in busbw.items()},
    }
    spread = _sweep_spread(raw["collectives"])
    if spread:
        out["collective_sweeps"] = len(raw["collectives"][0]["sweeps_s"])
        out["sweep_spread"] = spread
    return out


def _sweep_spread(collectives: list[dict[str, Any]]) -> dict[str, float]:
    """Per scope and collective, the median over sizes of ``(slowest - fastest sweep) / median sweep``: how
    far one sweep could have been from the figure kept (``probe.collectives``); empty with a single sweep."""
    ranges: dict[str, list[float]] = {}
    for c in collectives:
        runs = c.get("sweeps_s") or []
        if len(runs) > 1:
            ranges.setdefault(f"{c['scope']} {c['op']}", []).append((max(runs) - min(runs)) / c["time_s"])
    return {k: round(statistics.median(v), 3) for k, v in ranges.items()}


def probe_profile(raw: dict[str, Any], *, name: str, gpu: GPUSpec, nics_per_node: int) -> dict[str, Any]:
    """The profile mapping for a probe's raw record (``autotune.probe.worker``)."""
    on_cpu = raw["device"] == "cpu"
    dtype = "fp32" if on_cpu else "bf16"
    rows = sorted((g for g in raw["gemm"] if g["dtype"] == dtype), key=lambda g: g["m"] * g["n"] * g["k"])
    rates = sorted(g["flops_per_s"] for g in rows[len(rows) // 2 :])  # the larger half of the shapes
    typical = rates[len(rates) // 2]
    peak = max(g["flops_per_s"] for g in rows) if on_cpu else gpu.peak_flops(dtype) or typical
    overrides: dict[str, Any] = {"gemm_efficiency": round(typical / peak, 4)}
    if on_cpu:  # CPU trials compute a bf16 plan in fp32 (catalog 'cpu' entry): both priced at fp32
        overrides |= {
            "fp32_tflops": round(peak / 1e12, 5),
            "bf16_tflops": round(peak / 1e12, 5),
            "memory_bandwidth_gb_s": round(raw["copy_bytes_per_s"] / HBM_EFFICIENCY / 1e9, 3),
        }
    out: dict[str, Any] = {
        "name": name,
        "kind": "probe",
        "measured": raw["finished"],
        "gpu": gpu.key,
        "source": f"autotune probe on {raw['host']} ({raw['device_name']}), {raw['num_nodes']} node(s) x "
        f"{raw['local_world_size']} ranks, torch {raw['torch']}, load average "
        f"{raw['load_avg_before']} -> {raw['load_avg_after']}",
        "gpu_overrides": overrides,
        "cluster": {"collective_efficiency": 1.0},
    }
    if raw.get("overlap"):
        out["cluster"]["dp_overlap_fraction"] = round(raw["overlap"]["dp_overlap_fraction"], 3)
    if on_cpu and raw.get("cpus"):  # ranks share the node's cores (pipeline.shared_core_bubble_fraction)
        out["cluster"]["cores_per_node"] = int(raw["cpus"])
    if on_cpu and raw.get("op_overhead"):  # on GPUs the launches hide behind the kernels (GPUSpec)
        overrides["op_overhead_us"] = round(raw["op_overhead"]["op_overhead_s"] * 1e6, 3)
        if raw["op_overhead"].get("dtensor_op_overhead_s") is not None:
            overrides["dtensor_op_overhead_us"] = round(raw["op_overhead"]["dtensor_op_overhead_s"] * 1e6, 2)
        if raw["op_overhead"].get("dtensor_collective_overhead_s") is not None:
            overrides["dtensor_collective_overhead_us"] = round(
                raw["op_overhead"]["dtensor_collective_overhead_s"] * 1e6, 1
            )
    if on_cpu and raw.get("pipeline"):
        overrides["pipeline_action_us"] = {
            s: round(v * 1e6, 1) for s, v in raw["pipeline"]["pipeline_action_s"].items()
        }
    intra = _link_fit(raw, "intra", 1)
    inter = _link_fit(raw, "inter", nics_per_node)
    if intra:
        out["intra_node_link"] = intra
        fits = {op: _link_fit(raw, "intra", 1, op) for op in PER_OP}
        if all(fits.values()):
            out["intra_node_collectives"] = fits
    if inter:
        out["inter_node_link"] = inter
    out["summary"] = _summary(raw)
    out["measurements"] = {
        "gemm": raw["gemm"],
        "collectives": raw["collectives"],
        "copy_bytes_per_s": raw["copy_bytes_per_s"],
        "overlap": raw.get("overlap"),
        "op_overhead": raw.get("op_overhead"),
        "pipeline": raw.get("pipeline"),
    }
    return out
