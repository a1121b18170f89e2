"""Published peak memory per GPU on H100/H200/B200 against ``autotune estimate`` (the memory model).

Rule for what a published figure includes: torchtitan prints ``max_reserved`` of the CUDA caching allocator
(torchtitan/components/metrics.py ``DeviceMemoryMonitor.get_peak_stats``: ``max_reserved_gib``), so its
figures are RESERVED memory and are compared with the full prediction, allocator reserve included
(CUDA context and NCCL are outside the allocator and not in the figure: they are subtracted from the
prediction for the comparison). Rows that only say a layout ran on a GPU ("ran on 80 GB", no figure)
are checked for one thing: the model must not call them out of memory.

Rows: every entry of benchmarks/data/modern_runs.yaml (its source and the fields it fills are in
``_modern_row``; a model without a catalog preset is read from the row's Hugging Face shape as
``modern_runs.py`` reads it; Mixture-of-Experts rows take ``moe_recipes.py``'s model and plan; rows it cannot
turn into a plan are listed with the reason), plus ``ROWS`` below: layouts of the issue 21 table that ran
without a published figure.
Nothing here is tuned to a row: the prediction is ``estimate()`` as the CLI runs it.

Usage:  python benchmarks/memory_published.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.catalog import gpu_names, load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.costmodel.reserve import reserve_bytes
from autotune.plan import ParallelPlan
from autotune.specs import ModelSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
from benchmarks import modern_runs, moe_recipes, moe_runs  # noqa: E402
from benchmarks._fsdp_stacks import row_numerics  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODERN = ROOT / "data" / "modern_runs.yaml"
_GIB = 1024**3
TARGET = 0.10

_COMPILE = "torch.compile / async TP not modelled"
_COMPILED_LOSS = ("e7c0cae", "820504e", "6fc499f6")
"""torchtitan commits of the rows that descend from bbb1b616e (2025-04-02), which compiles the loss with the
model (``git merge-base --is-ancestor bbb1b616e <commit>``); the 2024-12 (9dec370) and 0.0.2 rows do not.
Their plans set ``compile`` (priced: the compiled loss and the compiled op-SAC block's saved tensors,
``Kernels.compiled_sac``); the compiled block's fusions are not: they stay unscored."""
_END_UNITS = ("6fc499f6",)
"""torchtitan commits that descend from 83e694105 (2025-07-28), where ``apply_fsdp`` wraps ``tok_embeddings``
and ``[norm, output]`` as their own FSDP units, as autotune's trials do (``trials.parallelize.end_units``) and
the model prices (``dpbuffers.end_backward_bytes``). Earlier torchtitan rows (9dec370, e7c0cae, 820504e,
0.0.2) kept both ends in the root unit, gathered through the whole backward: their note says so."""

_PUBLISHED_CONFLICT = {
    "tt-2412-llama31-405b-h100-fsdp8-tp8-pp8-1f1b": "published peaks conflict: Table 6's FSDP 8 CP 1 row "
    "(same 9dec370 setup, 1F1B, 8 micro-batches of 32k tokens per rank, same 15/16x6/15 split) is 75.3 GiB, "
    "this 8 x 4 x 8k one 82.5; every memory term scales with the tokens per micro-batch, so both price alike",
}
"""Rows whose published peak disagrees with another published peak of the same memory shape (the reason is
the note; the row stays as published)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    name: str
    source: str
    model: str
    gpu: str
    plan: dict[str, Any]
    published_gib: float | None
    """None: the source only says it ran on this GPU."""
    includes: str
    note: str = ""
    modelled: bool = True
    """False: the run used something the plan cannot express (torch.compile, async TP); shown, not scored."""
    spec: ModelSpec | None = None
    """The model read from the row's Hugging Face shape where it has no catalog preset (``model``: its id)."""
    excused: bool = True
    """Whether what the plan cannot express may explain an out-of-memory call (an MoE row: only a memory
    saver, ``moe_runs.saves_memory``); counted apart from the misses when not ``modelled``."""
    extra: dict[str, Any] = field(default_factory=dict)


ROWS: list[Row] = [
    Row(
        name="Megatron-Bridge Llama-3-70B fp8 TP4 PP8 VP5 DP2 (issue 21 table)",
        model="llama3-70b",
        gpu="h100-sxm",
        source="issue 21 table (Megatron-Bridge llama3_70b H100 fp8 performance recipe)",
        plan={
            "framework": "megatron",
            "tp": 4,
            "pp": 8,
            "dp": 2,
            "schedule": "interleaved",
            "virtual_stages": 5,
            "micro_batch": 1,
            "global_batch": 128,
            "seq_len": 8192,
            "sharding": "zero1",
            "sequence_parallel": True,
            "precision": "fp8",
        },
        published_gib=None,
        includes="ran on 80 GB",
    ),
    Row(
        name="Megatron-Bridge Llama-3-8B fp8 DP8 (issue 21 table), 5 layers recomputed",
        model="llama3-8b",
        gpu="h100-sxm",
        source="issue 21 table; Megatron-Bridge scripts/performance configs "
        "LLAMA3_8B_PRETRAIN_CONFIG_H100_FP8_CS_V1: context_parallel_size=1, recompute_num_layers=5",
        plan={
            "framework": "megatron",
            "dp": 8,
            "micro_batch": 1,
            "global_batch": 128,
            "seq_len": 8192,
            "sharding": "zero1",
            "precision": "fp8",
            "recompute": "full",
            "recompute_layers": 5,
        },
        published_gib=None,
        includes="ran on 80 GB",
    ),
]


def predict(row: Row) -> dict[str, Any]:
    model = row.spec or load_model(row.model)
    plan = ParallelPlan(**row.plan)
    cluster = make_cluster(gpu=row.gpu, num_gpus=plan.world_size)
    est = estimate(model, cluster, plan)
    total = est.memory_bytes_per_gpu
    outside = reserve_bytes(cluster, plan)  # CUDA context + NCCL: not in the allocator's reserved figure
    comparable = total - outside if row.published_gib is not None else total
    out_of_memory = any(r.startswith("out of memory") for r in est.reasons)
    error = comparable / (row.published_gib * _GIB) - 1 if row.published_gib else None
    return {
        "name": row.name,
        "source": row.source,
        "model": row.model,
        "gpu": row.gpu,
        "plan": row.plan,
        "includes": row.includes,
        "published_gib": row.published_gib,
        "predicted_gib": total / _GIB,
        "needed_gib": est.memory.needed_bytes / _GIB,
        "compared_gib": comparable / _GIB,
        "error": error,
        "called_oom": out_of_memory,
        "capacity_gib": est.memory_capacity_bytes / _GIB,
        "modelled": row.modelled,
        "excused": not row.modelled and row.excused,
        "note": row.note,
        "breakdown_gib": {k: v / _GIB for k, v in est.memory.as_dict().items()},
    }


def modern_rows(path: Path = MODERN) -> tuple[list[Row], dict[str, str]]:
    """Every dense entry of the data branch's file with a catalog model: those with a measured peak are
    compared, the others checked for "ran, so not out of memory"; the reasons of the rest."""
    if not path.exists():
        return [], {}
    rows, skipped = [], {}
    for entry in yaml.safe_load(path.read_text()) or []:
        measured = (entry.get("measured") or {}).get("peak_memory_gib")
        try:
            rows.append(_modern_row(entry, None if measured is None else float(measured)))
        except (KeyError, ValueError, TypeError) as e:
            skipped[str(entry.get("id"))] = f"cannot build a plan: {e}"
    return rows, skipped


def _modern_row(entry: dict[str, Any], measured: float | None) -> Row:
    """One data-branch entry as a plan. Each filled field follows the framework's default, cited:
    torchtitan applies sequence parallelism whenever TP > 1 (torchtitan/models/llama3/infra/parallelize.py
    ``apply_tp``); under PP its default ``fsdp_reshard_after_forward`` keeps parameters gathered
    (``apply_fsdp``: ``reshard_after_forward = not pp_enabled``), i.e. fsdp-grad-op; its 2024-12 pipeline
    split the local batch into PP-degree micro-batches (``pipeline_parallel_microbatches`` default) and
    interleaved schedules ran 2 stages per rank (torchtitan/distributed/pipeline_parallel.py). Megatron
    rows: sequence parallelism with TP (NeMo/Megatron-Bridge recipes set it whenever TP > 1); a recompute
    the source does not print is priced as none (the larger memory); the recipe's
    ``cpu_offloading_num_layers`` as ``offload_activation_layers``; NeMo 1.0's Apex ``distributed_fused_adam``
    (16-bit master remainders) as ``precision_aware_optimizer``, its Megatron-Core equivalent."""
    if entry.get("moe"):
        return _moe_row(entry, measured)
    fw = str(entry.get("framework")).lower()
    if fw not in ("torchtitan", "megatron", "llm-foundry", "automodel"):
        raise ValueError(f"framework {fw} not priced here")
    if entry.get("sharding") not in ("zero1", "fsdp-full", "megatron-fsdp"):
        raise ValueError(f"sharding {entry.get('sharding')} not offered")
    torchtitan = fw == "torchtitan"
    foundry = fw in ("llm-foundry", "automodel")  # FSDP stacks with their own numerics (modern_runs.numerics)
    tp, pp, dp, cp = (int(entry.get(k) or 1) for k in ("tp", "pp", "dp", "cp"))
    # unprinted micro-batch: torchtitan's pipeline splits the local batch into PP-degree micro-batches; a
    # Megatron run takes 1, as modern_runs.py prices its speed
    micro = entry.get("micro_batch") or (int(entry["global_batch"]) // dp // pp if torchtitan else 1)
    recompute = {"op-sac": "selective", None: "none"}.get(entry.get("recompute"), entry.get("recompute"))
    plan: dict[str, Any] = {
        "framework": "fsdp" if torchtitan or foundry else fw,
        "tp": tp,
        "pp": pp,
        "dp": dp,
        "cp": cp,
        "micro_batch": int(micro),
        "global_batch": int(entry["global_batch"]),
        "seq_len": int(entry["seq_len"]),
        "precision": "fp8" if "fp8" in str(entry.get("precision")) else "bf16",
        "recompute": recompute,
        "sharding": "none"
        if dp * cp == 1
        else {"megatron-fsdp": "fsdp-full"}.get(entry["sharding"], entry["sharding"]),
        "sequence_parallel": tp > 1,
    }
    layers = re.search(r"recompute_num_layers=(\d+)", str(entry.get("recompute_detail")))
    if recompute == "full" and layers and not torchtitan and "block" in str(entry.get("recompute_detail")):
        plan["recompute_layers"] = int(layers.group(1))
    if entry.get("vp"):
        plan.update(schedule="interleaved", virtual_stages=int(entry["vp"]))
    if torchtitan and cp > 1:  # torchtitan's default context_parallel_rotate_method, as modern_runs.py
        plan["cp_comm"] = "allgather"
    if torchtitan and pp > 1:
        plan["sharding"] = "fsdp-grad-op"
        if "interleaved" in str(entry["id"]):
            plan.update(schedule="interleaved", virtual_stages=int(entry.get("vp") or 2))
    if not torchtitan and (n := modern_runs.offload_layers(entry)):  # Megatron --cpu-offloading-num-layers
        plan["offload_activation_layers"] = n
    if not torchtitan and entry.get("grad_reduce_dtype"):  # the recipe's gradient buffer dtype (data note)
        plan["grad_reduce_dtype"] = entry["grad_reduce_dtype"]
    if fw == "megatron" and entry.get("cross_entropy") == "te":  # Transformer Engine's loss (data README)
        plan["loss_kernel"] = "fused"
    if not torchtitan and "distributed_fused_adam" in str(entry):
        # Apex DistributedFusedAdam as NeMo 1.0 builds it: 16-bit master remainders (states.py)
        plan["precision_aware_optimizer"] = True
    knobs = entry.get("knobs") or {}
    if foundry:
        plan.update(row_numerics(entry))
    if torchtitan and knobs.get("compile") and any(c in str(entry.get("source")) for c in _COMPILED_LOSS):
        plan["compile"] = True  # its loss compiled too: Kernels.compiled_loss
    gpu = _row_gpu(entry)
    unmodelled = bool(knobs.get("compile")) or bool(knobs.get("async_tp"))
    kind = (entry.get("measured") or {}).get("memory_kind", "?")
    return Row(
        name=str(entry["id"]),
        source=str(entry.get("source", "")).split(" (")[0],
        model=str(entry.get("model") or entry["id"]),
        spec=None if entry.get("model") else modern_runs.row_model(entry),
        gpu=gpu,
        plan=plan,
        published_gib=measured,
        includes=f"max {kind}" if measured is not None else f"ran on {gpu}",
        modelled=not unmodelled,
        note=(_COMPILE if unmodelled else "")
        + ("; compiled loss and op-SAC partition priced" if plan.get("compile") else "")
        + (
            "; ends in the root unit (torchtitan before 83e694105) priced as their own"
            if _ends_in_root(entry)
            else ""
        )
        + (f"; {_PUBLISHED_CONFLICT[entry['id']]}" if entry.get("id") in _PUBLISHED_CONFLICT else "")
        + ("" if entry.get("recompute") else " recompute not printed: priced none"),
    )


def _row_gpu(entry: dict[str, Any]) -> str:
    """The catalog GPU a row ran on: Meta's Grand Teton H100s (96 GB HBM2e, their ``gpu_note``) as
    ``h100-96gb``, else the row's ``gpu``."""
    return "h100-96gb" if "96 GB" in str(entry.get("gpu_note")) else str(entry["gpu"])


def _moe_row(entry: dict[str, Any], measured: float | None) -> Row:
    """A Mixture-of-Experts entry as ``benchmarks/moe_runs.py`` prices its speed (the same model and plan:
    the row's shape, its layout with EP, dispatcher and ``--recompute-modules``). What its recipe ran that a
    plan cannot express (``moe_recipes.unpriced_knobs``: the precision-aware optimizer, activation offload,
    fp8 parameter gather... most of which save memory) is named in the note; the row is then shown, not
    scored."""
    reason = moe_runs.skip_reason(entry)
    if reason or entry["gpu"] not in gpu_names():
        raise ValueError(reason or f"GPU {entry['gpu']} is not in autotune's catalog")
    plan = moe_recipes.row_plan(entry)
    unpriced = moe_recipes.unpriced_knobs(entry)
    gpu = _row_gpu(entry)
    compiled = bool((entry.get("knobs") or {}).get("compile"))  # as the dense rows: not scored
    return Row(
        name=str(entry["id"]),
        source=str(entry.get("source", "")).split(" (")[0],
        model=str(entry["id"]),
        spec=moe_recipes.row_model(entry),
        gpu=gpu,
        plan={f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)},
        published_gib=measured,
        includes=f"max {(entry.get('measured') or {}).get('memory_kind', '?')}"
        if measured is not None
        else f"ran on {gpu}",
        modelled=not unpriced and not compiled,
        excused=compiled or moe_runs.saves_memory(unpriced, str(entry.get("fp8_recipe"))),
        note=("recipe beyond the plan: " + ", ".join(unpriced))
        if unpriced
        else (_COMPILE if compiled else ""),
    )


def _ends_in_root(entry: dict[str, Any]) -> bool:
    """A torchtitan row whose commit kept the model's ends in the root FSDP unit (not in ``_END_UNITS``)."""
    return str(entry.get("framework")).lower() == "torchtitan" and not any(
        c in str(entry.get("source")) for c in _END_UNITS
    )


def _markdown(results: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    scored = [r for r in results if r["modelled"] and r["error"] is not None]
    within = sum(abs(r["error"]) <= TARGET for r in scored)
    peaks = [r for r in results if r["error"] is not None]
    oom = [r["name"] for r in results if r["called_oom"] and not r["excused"]]
    oom_unmodelled = [r["name"] for r in results if r["called_oom"] and r["excused"]]
    lines = [
        "# Published peak memory vs `autotune estimate`",
        "",
        "Generated by `python benchmarks/memory_published.py`. *predicted* = reserved peak + CUDA/NCCL "
        "context; *allocated* = the same without the allocator's cached slack, what `estimate` compares "
        "with the device to call a plan out of memory (`MemoryBreakdown.needed_bytes`); "
        "*compared* = prediction minus CUDA context "
        "and NCCL (outside the caching allocator) when the figure is the allocator's reserved peak; "
        "*error* = compared / published - 1. Rows marked *not scored* ran with something a plan cannot "
        "express (see note) and are shown, not counted.",
        "",
        f"Scored rows within {TARGET:.0%}: {within} of {len(scored)}; all rows with a published peak: "
        f"{sum(abs(r['error']) <= TARGET for r in peaks)} of {len(peaks)} within {TARGET:.0%}. "
        f"Rows that ran ({len(results)}) but are called out of memory: {len(oom)}"
        f"{': ' + '; '.join(oom) if oom else ''}; and {len(oom_unmodelled)} more that used something a plan "
        f"cannot express (their note){': ' + '; '.join(oom_unmodelled) if oom_unmodelled else ''}.",
        "",
        "| row | GPU | published | predicted | allocated | compared | error | OOM? | figure is | note |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        pub = f"{r['published_gib']:.1f}" if r["published_gib"] else "ran"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        note = r["note"] + ("" if r["modelled"] else " (not scored)")
        lines.append(
            f"| {r['name']} | {r['gpu']} | {pub} | {r['predicted_gib']:.1f} | {r['needed_gib']:.1f} "
            f"| {r['compared_gib']:.1f} "
            f"| {err} | {'yes' if r['called_oom'] else 'no'} | {r['includes']} | {note} |"
        )
    lines += ["", "Sources:"] + sorted({f"- {r['source']}" for r in results})
    if skipped:
        lines += ["", "Not set up:"] + [f"- {k}: {v}" for k, v in skipped.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results"))
    args = parser.parse_args(argv)
    extra, skipped = modern_rows()
    results = [predict(r) for r in ROWS + extra]
    out = Path(args.out)
    (out / "memory_published.json").write_text(
        json.dumps({"rows": results, "skipped": skipped}, indent=1) + "\n"
    )
    (out / "memory_published.md").write_text(_markdown(results, skipped))
    print(_markdown(results, skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
