"""Predict the published Mixture-of-Experts training runs (``moe: true`` rows of
benchmarks/data/modern_runs.yaml) with the cost model and compare throughput like for like.

Each row's ``shape`` (Hugging Face config keys) becomes a ModelSpec through ``catalog.model_from_dict``, its
layout a ParallelPlan (``vp`` -> the interleaved schedule) and ``gpu`` / ``num_gpus`` / ``gpus_per_node`` a
catalog cluster. The error of a row is ``predicted / measured - 1`` in tokens/s per GPU; rows that publish
only TFLOP/s per GPU are converted with the row's FLOP convention (Megatron's
``num_floating_point_operations``: causal attention counted as ``s/2``, top-k routed + shared experts, no
recompute), i.e. our model FLOPs per token with the attention term halved.

What is fixed for every row (no per-row or per-model factor; the row readers named here live in
``benchmarks/moe_recipes.py``):
- multi-token prediction (DeepSeek-V3's ``num_nextn_predict_layers: 1``, which the Megatron-Bridge recipes
  keep) is priced as the shape says (``costmodel.mtp``; with PP the emitted layout gives it a block's place
  in the last chunk, as the recipes' ``...|tmL`` / ``...mL`` layouts do);
- dispatchers: the plan's ``moe_dispatcher`` is the flex backend the recipe names (``dispatcher``; DeepEP /
  HybridEP send a token once per destination node), else the plain all-to-all of ``costmodel.moe``;
  balanced load (the perf tables force-balance the routing); the 'flex' column marks rows whose notes
  mention the flex dispatcher;
- rows whose recipe runs Megatron's EP overlap (``--overlap-moe-expert-parallel-comm``, the zoo's "EP A2A
  overlap") set ``plan.moe_a2a_overlap`` (``a2a_overlap``; priced by ``costmodel.epoverlap`` with
  ``--delay-wgrad-compute``, which most of them also set);
- token-drop rows run at capacity factor 1.0, padded (``TOKEN_DROP_CAPACITY``: the capacity and padding
  scale the routed copies, and the dispatcher skips its host sync: ``costmodel.moe``, ``costmodel.moehost``);
- Megatron's fine-grained activation offloading of a row's recipe (``--offload-modules expert_fc1 moe_act``)
  becomes ``plan.offload_modules`` (``offload_modules``; ``costmodel.actoffload``);
- the recipe's DP and TP overlap switches (``knobs``: ``--overlap-grad-reduce``, ``--overlap-param-gather``,
  ``--tp-comm-overlap``) become the plan's fields (``overlap_knobs``);
- Megatron's ``--recompute-modules`` of a selective row become ``plan.recompute_modules``
  (``recompute_modules``); the memory they free and the forward work they rerun are priced
  (``costmodel.recompute_modules``);
- framework fsdp rows (torchtitan, NeMo AutoModel) run their dispatcher (torchtitan's all-to-all or DeepEP),
  compile and numerics as plan fields; the attention core is the catalog's default kernel (cuDNN) unless the
  row names the one its software ran (``attention_kernel``: torchtitan's 2025 SDPA runs FlashAttention-2, and
  for MLA's unequal head widths torch's memory-efficient kernel; FlexAttention is priced as FlashAttention-2);
- rows not set up (listed with the reason): a GPU not in autotune's catalog (H800), a micro-batch or
  recompute mode the source does not state, Megatron-FSDP whose sharding strategy the source does not
  state (``MEGATRON_FSDP_UNSTATED``).

Usage:  python benchmarks/moe_runs.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from autotune.catalog import gpu_names
from autotune.costmodel import estimate, flops, step_time
from autotune.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
from benchmarks import release_spread  # noqa: E402
from benchmarks._fsdp_stacks import FSDP_STACKS  # noqa: E402
from benchmarks.modern_runs import row_cluster  # noqa: E402
from benchmarks.moe_recipes import (  # noqa: E402
    _RECOMPUTE,
    TOKEN_DROP_CAPACITY,
    offload_modules,
    recompute_modules,
    row_model,
    row_plan,
    token_drop,
    unpriced_knobs,
)

ROOT = Path(__file__).resolve().parent
DATA = ROOT / "data" / "modern_runs.yaml"
MEGATRON_FSDP_UNSTATED = (
    "Megatron-FSDP with its sharding strategy not stated: Megatron-LM at the row's code (1e05700, "
    "arguments.py) defaults --data-parallel-sharding-strategy to no_shard; autotune's megatron fsdp-full is "
    "optim_grads_params"
)


def skip_reason(row: dict[str, Any]) -> str | None:
    if row["gpu"] not in gpu_names():
        return f"GPU {row['gpu']} is not in autotune's catalog"
    if row.get("micro_batch") is None:
        return "micro-batch not stated"
    if row.get("recompute") not in _RECOMPUTE:
        return f"recompute {row.get('recompute')!r} is not a plan mode"
    if row["sharding"] == "megatron-fsdp":
        return MEGATRON_FSDP_UNSTATED
    fsdp = ("fsdp-full", "fsdp-grad-op") if row["framework"] in FSDP_STACKS else ()
    if row["sharding"] not in ("none", "zero1", *fsdp):
        return f"sharding {row['sharding']} is not a plan sharding"
    if row["framework"] not in ("megatron", *FSDP_STACKS):
        return f"framework {row['framework']}"
    m = row["measured"]
    if not m.get("tokens_per_s_per_gpu") and not m.get("tflops_per_gpu"):
        return "no throughput published"
    return None


def _layout_extras(row: dict[str, Any]) -> list[str]:
    """What sets a row apart from another release's of the same layout: its unpriced recipe settings and its
    routing (token drop is a plan field the release-spread key does not read)."""
    return [*unpriced_knobs(row), *(["token drop"] if token_drop(row) else [])]


def _megatron_flops_per_token(model, seq_len: int) -> float:
    """Megatron's model FLOPs per token (module docstring): causal attention counted as ``s/2``."""
    full = flops.model_flops_per_token(model, seq_len)
    return full - 1.5 * model.num_layers * flops.attention_flops_per_token(model, seq_len)


def predict(row: dict[str, Any]) -> dict[str, Any]:
    model, plan, cluster = row_model(row), row_plan(row), row_cluster(row)
    est = estimate(model, cluster, plan)
    if row.get("attention_kernel"):  # the kernel the row's software ran, where it says (modern_runs.py)
        step = step_time(model, cluster, plan, attention_kernel=str(row["attention_kernel"]))
        est = dataclasses.replace(est, time=step)
    measured = row["measured"]
    if measured.get("tokens_per_s_per_gpu"):
        meas, metric = float(measured["tokens_per_s_per_gpu"]), "tokens/s/GPU"
    else:
        meas = measured["tflops_per_gpu"] * 1e12 / _megatron_flops_per_token(model, plan.seq_len)
        metric = "TFLOP/s/GPU -> tokens/s/GPU"
    pred = est.tokens_per_s_per_gpu
    t = est.time.as_dict()
    flex = "flex" in str(row.get("notes", "")) or "deepep" in row["id"] or row.get("dispatcher") == "deepep"
    return {
        "id": row["id"],
        "gpu": row["gpu"],
        "gpus": row["num_gpus"],
        "layout": _layout(row),
        "precision": row["precision"],
        "metric": metric,
        "measured": meas,
        "predicted": pred,
        "error": pred / meas - 1,
        "flex_dispatcher": flex,
        "legal": not est.reasons,
        "reasons": list(est.reasons),
        "ep_comm_share": t["ep_comm_s"] / t["step_time_s"],
        "mfu": est.mfu,
        "memory_gib": est.memory_bytes_per_gpu / 1024**3,
        "unpriced": unpriced_knobs(row),
        "saves_memory": saves_memory(unpriced_knobs(row), str(row.get("fp8_recipe"))),
    }


def _layout(row: dict[str, Any]) -> str:
    vp = f" vp{row['vp']}" if row.get("vp") else ""
    return (
        f"tp{row['tp']} pp{row['pp']}{vp} cp{row['cp']} ep{row['ep']} dp{row['dp']} "
        f"mbs{row['micro_batch']} gbs{row['global_batch']} s{row['seq_len']} {row['recompute']}"
        + (f"[{'+'.join(recompute_modules(row))}]" if recompute_modules(row) else "")
        + (f" drop@{TOKEN_DROP_CAPACITY:g}" if token_drop(row) else "")
        + (f" offload[{'+'.join(offload_modules(row))}]" if offload_modules(row) else "")
    )


def run() -> dict[str, Any]:
    rows = [r for r in yaml.safe_load(DATA.read_text()) if r.get("moe")]
    results, skipped = [], []
    for row in rows:
        reason = skip_reason(row)
        if reason:
            skipped.append({"id": row["id"], "reason": reason})
            continue
        try:
            results.append(predict(row))
        except ConfigError as e:
            skipped.append({"id": row["id"], "reason": str(e)})
    stats = {
        "rows": len(rows),
        "skipped": len(skipped),
        **_stats(results),
        "ran_but_called_oom": sum(_called_oom(r) and not r["saves_memory"] for r in results),
        "called_oom_beyond_plan": sum(_called_oom(r) and r["saves_memory"] for r in results),
        "ran_but_called_illegal": sum(bool(r["reasons"]) for r in results),
        "h100": _stats([r for r in results if r["gpu"] == "h100-sxm"]),
    }
    spread = release_spread.groups(
        rows,
        {r["id"]: r["predicted"] for r in results},
        {r["id"]: r["measured"] for r in results},
        extra=_layout_extras,
    )
    stats["same_layout_groups"] = len(spread)
    stats["same_layout_unexplained_over_30pct"] = sum(g.unexplained > 0.30 for g in spread)
    return {"stats": stats, "results": results, "skipped": skipped, "spread": spread}


MEMORY_SAVERS = ("activation offload", "precision-aware optimizer", "paged stash", "fp8 param gather")
"""Unpriced recipe settings (``_UNPRICED``) that lower the peak: a row that ran with one of them and is called
out of memory without it is counted apart (``called_oom_beyond_plan``), not as a layout the model wrongly
rejects. Not fp8 parameter gather under MXFP8: its parameters hold rowwise and columnwise fp8 data with
scales (Transformer Engine ``MXFP8Tensor``), about the 2 B of the bf16 weights priced, and gather in bf16
through the gradient buffer (megatron-core 0.16 ``param_and_grad_buffer.py``
``reuse_grad_buf_for_mxfp8_param_ag``)."""


def _called_oom(result: dict[str, Any]) -> bool:
    return any("out of memory" in x for x in result["reasons"])


def saves_memory(unpriced: list[str], fp8_recipe: str) -> bool:
    """Whether a row ran with a memory saver beyond the plan (``MEMORY_SAVERS``)."""
    mx = fp8_recipe.startswith("mx")
    return any(k in MEMORY_SAVERS and not (mx and k == "fp8 param gather") for k in unpriced)


def _stats(results: list[dict[str, Any]]) -> dict[str, Any]:
    errors = [abs(r["error"]) for r in results]
    if not errors:
        return {"priced": 0}
    return {
        "priced": len(results),
        "median_abs_error": statistics.median(errors),
        "mean_abs_error": statistics.fmean(errors),
        "within_15pct": sum(e <= 0.15 for e in errors),
        "median_signed_error": statistics.median(r["error"] for r in results),
    }


def markdown(doc: dict[str, Any]) -> str:
    s = doc["stats"]
    lines = [
        "# Published MoE training runs: predicted vs measured",
        "",
        "Generated by `python benchmarks/moe_runs.py` from the `moe: true` rows of "
        "benchmarks/data/modern_runs.yaml (method and fixed assumptions: the script's docstring).",
        "",
        f"{s['priced']} of {s['rows']} rows priced, {s['skipped']} not set up. "
        f"Median |error| {s['median_abs_error']:.1%}, mean {s['mean_abs_error']:.1%}, "
        f"median signed {s['median_signed_error']:+.1%}; {s['within_15pct']} rows within 15 %. "
        f"H100 rows: {s['h100']['priced']}, median |error| {s['h100']['median_abs_error']:.1%}, "
        f"median signed {s['h100']['median_signed_error']:+.1%}, "
        f"{s['h100']['within_15pct']} within 15 %. Rows that ran but are called out of memory: "
        f"{s['ran_but_called_oom']} (and {s['called_oom_beyond_plan']} that ran with a memory saver a plan "
        f"cannot express, `MEMORY_SAVERS`); illegal for any reason: {s['ran_but_called_illegal']}. The last "
        "column lists what each row's recipe ran that a plan cannot express (`unpriced_knobs`).",
        "",
        "| run | GPU | GPUs | layout | prec | measured tok/s/GPU | predicted | error | EP a2a share | "
        "flex | legal | recipe beyond the plan |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        lines.append(
            f"| {r['id']} | {r['gpu']} | {r['gpus']} | {r['layout']} | {r['precision']} | "
            f"{r['measured']:,.0f} | {r['predicted']:,.0f} | {r['error']:+.1%} | "
            f"{r['ep_comm_share']:.0%} | {'yes' if r['flex_dispatcher'] else ''} | "
            f"{'yes' if r['legal'] else r['reasons'][0]} | {', '.join(r['unpriced'])} |"
        )
    lines += release_spread.markdown(doc["spread"])
    lines += ["", "## Not set up", ""] + [f"- {x['id']}: {x['reason']}" for x in doc["skipped"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    doc = run()
    args.out.mkdir(parents=True, exist_ok=True)
    spread = [
        {"members": [dataclasses.asdict(m) for m in g.members], "unexplained": g.unexplained}
        for g in doc["spread"]
    ]
    (args.out / "moe_runs.json").write_text(json.dumps(doc | {"spread": spread}, indent=1) + "\n")
    (args.out / "moe_runs.md").write_text(markdown(doc))
    print(json.dumps(doc["stats"], indent=1))


if __name__ == "__main__":
    main()
