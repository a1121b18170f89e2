"""Published training runs (benchmarks/published_runs.py) predicted by autotune and by llm-analysis.

llm-analysis (https://github.com/cli99/llm-analysis, 0.2.2) is a benchmark-only dependency: it pins
huggingface-hub < 0.15 (accelerate needs >= 0.21), so it lives in its own directory, never in autotune's
environment::

    pip install --target runs/bench-deps/llm-analysis llm-analysis==0.2.2
    python benchmarks/llm_analysis_compare.py

Same rows, same setup: each row's ``(ModelSpec, ClusterSpec, ParallelPlan)`` from published_runs.py
becomes llm-analysis's ``ModelConfig``/``ParallelismConfig`` and ``training(batch_size_per_gpu,
gradient_accumulation_steps, global_batch_size, seq_len, activation_recomputation, ds_zero, flash_attn)`` on
its own shipped GPU file of the same GPU (a non-integer FFN ratio is passed as ``expansion_ratio`` so that its
divisibility assert does not drop the Llama rows). llm-analysis's default efficiencies are 1.0 (peak); the
main column gives it autotune's inputs (``flops_efficiency`` = the catalog ``gemm_efficiency``,
``hbm_memory_efficiency`` = ``HBM_EFFICIENCY``) so the two models differ only in what they count; the "peak"
column is llm-analysis as shipped. Its ``latency_per_iter`` is compared in the row's own metric exactly like
autotune's prediction: error =
predicted throughput / measured throughput - 1. Rows llm-analysis refuses (its memory asserts) are listed.
Per-layer rows (Korthikanti Table 4) and the rows published_runs.py excludes are left out of both medians.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "runs" / "bench-deps" / "llm-analysis"))  # last: autotune's own packages win

import yaml  # noqa: E402

from autotune.costmodel.steptime import HBM_EFFICIENCY  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.specs import ClusterSpec, ModelSpec  # noqa: E402
from benchmarks import _published_setup as setup  # noqa: E402
from benchmarks import published_runs as pr  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
_LA_GPU = {
    "a100-80gb": "a100-sxm-80gb",
    "a100-40gb": "a100-sxm-40gb",
    "v100": "v100-sxm-32gb",
    "h100-sxm": "h100-sxm-80gb",
}
_ZERO = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp-full": 3, "fsdp-grad-op": 2, "hsdp": 3}


def _llm_analysis_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, flash: bool, efficiency: bool
) -> float:
    """llm-analysis's ``latency_per_iter`` for the row (raises what llm-analysis raises)."""
    from llm_analysis import analysis as la
    from llm_analysis.config import GPUConfig, ModelConfig, ParallelismConfig

    gpu_file = Path(la.__file__).parent / "gpu_configs" / f"{_LA_GPU[cluster.gpu.key]}.json"
    gpu = GPUConfig(**json.loads(gpu_file.read_text()))
    mcfg = ModelConfig(
        name=model.name,
        num_layers=model.num_layers,
        n_head=model.num_heads,
        hidden_dim=model.hidden_size,
        vocab_size=model.vocab_size,
        max_seq_len=plan.seq_len,
        num_key_value_heads=model.num_kv_heads,
        ffn_embed_dim=model.ffn_hidden_size,
        expansion_ratio=model.ffn_hidden_size / model.hidden_size,
    )
    par = ParallelismConfig(
        tp_size=plan.tp, pp_size=plan.pp, dp_size=plan.dp, sp_size=plan.tp if plan.sequence_parallel else 1
    )
    kwargs = (
        {"flops_efficiency": cluster.gpu.gemm_efficiency, "hbm_memory_efficiency": HBM_EFFICIENCY}
        if efficiency
        else {}
    )
    analysis = la.LLMAnalysis(mcfg, gpu, parallelism_config=par, **kwargs)
    recompute = {
        "none": la.ActivationRecomputation.NONE,
        "selective": la.ActivationRecomputation.SELECTIVE,
        "full": la.ActivationRecomputation.FULL,
    }[str(plan.recompute)]
    with contextlib.redirect_stdout(io.StringIO()):
        out = analysis.training(
            batch_size_per_gpu=plan.micro_batch,
            gradient_accumulation_steps=plan.num_microbatches,
            global_batch_size=plan.global_batch,
            seq_len=plan.seq_len,
            activation_recomputation=recompute,
            ds_zero=la.DSZeRO(_ZERO[str(plan.sharding)]),
            flash_attn=flash,
            mlp_gated_linear_units=model.gated_mlp,
        )
    return float(out["latency_per_iter"])


def compare_row(row: dict[str, Any]) -> dict[str, Any] | None:
    """autotune's and llm-analysis's errors for one row; None for rows left out (skipped, per-layer)."""
    outcome = pr.predict_row(row)
    if isinstance(outcome, str) or outcome.metric.startswith("ms/layer"):
        return None
    fill, _ = setup.ASSUMPTIONS.get(row["id"], ({}, ""))
    vocab = int(fill.get("vocab") or row.get("vocab"))
    model, cluster, plan = setup.row_model(row, vocab), setup.row_cluster(row), setup.row_plan(row, fill)
    peak = cluster.gpu.peak_flops(str(plan.precision)) or 0.0
    _, _, measured_s = pr._measured_time(row, vocab, peak)
    flash = setup.row_software(row)["flash_attention"]
    out = {
        "id": row["id"],
        "setup": outcome.setup,
        "metric": outcome.metric,
        "measured": outcome.measured,
        "autotune": outcome.predicted,
        "autotune_error": outcome.error,
        "excluded": bool(outcome.excluded or row["id"] in pr.EXCLUDED),
    }
    for col, eff in (("llm_analysis", True), ("llm_analysis_peak", False)):
        try:
            seconds = _llm_analysis_s(model, cluster, plan, flash, eff)
        except (AssertionError, KeyError, ValueError, ZeroDivisionError) as e:
            out[col], out[f"{col}_error"], out[f"{col}_refused"] = None, None, str(e).splitlines()[0][:120]
            continue
        out[col] = pr._to_metric(outcome.metric, seconds, row, vocab, peak)
        out[f"{col}_error"] = measured_s / seconds - 1
    return out


def _median_abs(rows: list[dict[str, Any]], col: str) -> float | None:
    errs = [abs(r[f"{col}_error"]) for r in rows if r.get(f"{col}_error") is not None]
    return statistics.median(errs) if errs else None


def main() -> None:
    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    rows = [r for r in (compare_row(row) for row in yaml.safe_load(pr.DATA.read_text())) if r]
    kept = [r for r in rows if not r["excluded"]]
    common = [r for r in kept if r["llm_analysis_error"] is not None]
    stats = {
        "rows": len(kept),
        "rows_llm_analysis_ran": len(common),
        "autotune_median_abs_error_all": _median_abs(kept, "autotune"),
        "autotune_median_abs_error_common": _median_abs(common, "autotune"),
        "llm_analysis_median_abs_error_common": _median_abs(common, "llm_analysis"),
        "llm_analysis_peak_median_abs_error_common": _median_abs(common, "llm_analysis_peak"),
    }
    out = RESULTS / "llm_analysis_compare.json"
    out.write_text(json.dumps({"stats": stats, "rows": rows}, indent=2) + "\n")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
