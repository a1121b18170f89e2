"""Published peak memory per GPU on H100/H200/B200 against ``autotune estimate`` (the memory model).

Rule for what a published figure includes: torchtitan prints ``max_reserved`` of the CUDA caching allocator
(torchtitan/components/metrics.py ``DeviceMemoryMonitor.get_peak_stats``: ``max_reserved_gib``), so its
figures are RESERVED memory and are compared with the full prediction, allocator reserve included
(CUDA context and NCCL are outside the allocator and not in the figure: they are subtracted from the
prediction for the comparison). Rows that only say a layout ran on a GPU ("ran on 80 GB", no figure)
are checked for one thing: the model must not call them out of memory.

Rows: ``ROWS`` below (each with its source), plus every entry of benchmarks/data/modern_runs.yaml that has
``measured.peak_memory_gib`` (built by the ``data`` branch; rows it cannot turn into a plan are listed with
the reason). Nothing here is tuned to a row: the prediction is ``estimate()`` as the CLI runs it.

Usage:  python benchmarks/memory_published.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.costmodel.memory import CUDA_CONTEXT_BYTES, NCCL_BYTES_PER_COMMUNICATOR, NCCL_CONTEXT_BYTES
from autotune.plan import ParallelPlan, Sharding

ROOT = Path(__file__).resolve().parent
MODERN = ROOT / "data" / "modern_runs.yaml"
_GIB = 1024**3
TARGET = 0.10

_TT = (
    "pytorch/torchtitan docs/performance.md @eaea6f6 (H100 96 GB HBM2e, torch/torchao/torchtitan of 2024-12)"
)
_TT_RESERVED = "max reserved (torchtitan DeviceMemoryMonitor)"


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
    extra: dict[str, Any] = field(default_factory=dict)


def _tt(
    name: str, model: str, gib: float, plan: dict[str, Any], *, modelled: bool = True, note: str = ""
) -> Row:
    return Row(
        name=name,
        source=_TT,
        model=model,
        gpu="h100-96gb",
        plan={"framework": "fsdp", **plan},
        published_gib=gib,
        includes=_TT_RESERVED,
        modelled=modelled,
        note=note,
    )


_T1 = {
    "dp": 8,
    "micro_batch": 2,
    "global_batch": 16,
    "seq_len": 8192,
    "sharding": "fsdp-full",
    "recompute": "selective",
}
_T3 = {**_T1, "dp": 128, "global_batch": 256}
_T4 = {
    "tp": 8,
    "dp": 32,
    "micro_batch": 16,
    "global_batch": 512,
    "seq_len": 8192,
    "sharding": "fsdp-full",
    "recompute": "full",
    "sequence_parallel": True,
    "precision": "fp8",
}
# torchtitan's default fsdp_reshard_after_forward ("default") does not reshard under PP
# (torchtitan/models/llama3/infra/parallelize.py apply_fsdp): fsdp-grad-op.
_T5 = {
    "tp": 8,
    "pp": 8,
    "dp": 8,
    "micro_batch": 1,
    "global_batch": 256,
    "seq_len": 8192,
    "sharding": "fsdp-grad-op",
    "recompute": "full",
    "sequence_parallel": True,
    "precision": "fp8",
}
_COMPILE = "torch.compile not modelled"

ROWS: list[Row] = [
    _tt("torchtitan T1 Llama3.1-8B FSDP8 SAC-op", "llama3-8b", 82.4, _T1),
    _tt("torchtitan T1 ... + compile", "llama3-8b", 77.0, _T1, modelled=False, note=_COMPILE),
    _tt(
        "torchtitan T1 ... + compile + Float8",
        "llama3-8b",
        76.8,
        {**_T1, "precision": "fp8"},
        modelled=False,
        note=_COMPILE,
    ),
    _tt("torchtitan T3 Llama3.1-8B FSDP128 SAC-op", "llama3-8b", 67.0, _T3),
    _tt("torchtitan T3 ... + compile", "llama3-8b", 62.0, _T3, modelled=False, note=_COMPILE),
    _tt(
        "torchtitan T3 ... + compile + Float8",
        "llama3-8b",
        61.8,
        {**_T3, "precision": "fp8"},
        modelled=False,
        note=_COMPILE,
    ),
    *[
        _tt(
            f"torchtitan T2 Llama3.1-8B FSDP{dp} CP{cp} {s // 1024}k full AC, fp8+compile",
            "llama3-8b",
            gib,
            {
                "dp": dp,
                "cp": cp,
                "micro_batch": 1,
                "global_batch": dp,
                "seq_len": s,
                "sharding": "fsdp-full",
                "recompute": "full",
                "precision": "fp8",
            },
            note="compiled; full AC leaves little for compile to fuse",
        )
        for dp, cp, s, gib in ((8, 1, 32768, 83.9), (4, 2, 65536, 84.2), (2, 4, 131072, 84.0))
    ],
    _tt(
        "torchtitan T4 Llama3.1-70B FSDP32 TP8 full AC, fp8+compile",
        "llama3-70b",
        71.9,
        _T4,
        note="compiled; full AC",
    ),
    _tt("torchtitan T4 ... + AsyncTP", "llama3-70b", 67.6, _T4, modelled=False, note="async TP not modelled"),
    _tt(
        "torchtitan T5 Llama3.1-405B FSDP8 TP8 PP8 1F1B, fp8+compile+AsyncTP",
        "llama3-405b",
        82.5,
        _T5,
        modelled=False,
        note="async TP; 2024-12 torch pipelining",
    ),
    _tt(
        "torchtitan T5 ... Interleaved 1F1B (2 stages/rank)",
        "llama3-405b",
        72.7,
        {**_T5, "schedule": "interleaved", "virtual_stages": 2},
        modelled=False,
        note="async TP; 2024-12 torch pipelining",
    ),
    *[
        _tt(
            f"torchtitan T6 Llama3.1-405B FSDP{dp} CP{cp} TP8 PP8 {s // 1024}k, fp8+compile+AsyncTP",
            "llama3-405b",
            gib,
            {**_T5, "dp": dp, "cp": cp, "seq_len": s, "global_batch": 8 * dp},
            modelled=False,
            note="async TP",
        )
        for dp, cp, s, gib in ((8, 1, 32768, 75.3), (4, 2, 65536, 75.9), (2, 4, 131072, 77.1))
    ],
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
        name="Megatron-Bridge Llama-3-8B fp8 DP8 (issue 21 table), recompute none",
        model="llama3-8b",
        gpu="h100-sxm",
        source="issue 21 table; Megatron-Bridge scripts/performance configs "
        "LLAMA3_8B_PRETRAIN_CONFIG_H100_FP8_CS_V1 sets recompute_num_layers=5, which a plan cannot express",
        plan={
            "framework": "megatron",
            "dp": 8,
            "micro_batch": 1,
            "global_batch": 128,
            "seq_len": 8192,
            "sharding": "zero1",
            "precision": "fp8",
        },
        published_gib=None,
        includes="ran on 80 GB",
        modelled=False,
        note="the recipe recomputes 5 of 32 layers (--recompute-num-layers 5); priced without",
    ),
    Row(
        name="NeMo Llama-2-70B SFT fp8 TP4 PP4 DP1 (issue 21 table)",
        model="70b",
        gpu="h100-sxm",
        source="issue 21 table (NeMo performance summary); sequence length, packing and optimizer options "
        "not stated there",
        plan={
            "framework": "megatron",
            "tp": 4,
            "pp": 4,
            "dp": 1,
            "micro_batch": 1,
            "global_batch": 32,
            "seq_len": 4096,
            "sequence_parallel": True,
            "precision": "fp8",
        },
        published_gib=None,
        includes="ran on 80 GB",
        modelled=False,
        note="recipe details (seq len, packing, optimizer) not stated; priced with 4096 tokens, no recompute",
    ),
]


def _outside_allocator_bytes(plan: ParallelPlan) -> float:
    """CUDA context + NCCL: in the prediction's reserve, not in the allocator's reserved figure."""
    axes = sum(d > 1 for d in (plan.tp, plan.pp, plan.dp, plan.cp)) + (plan.sharding is Sharding.HSDP)
    return CUDA_CONTEXT_BYTES + ((NCCL_CONTEXT_BYTES + axes * NCCL_BYTES_PER_COMMUNICATOR) if axes else 0.0)


def predict(row: Row) -> dict[str, Any]:
    model = load_model(row.model)
    plan = ParallelPlan(**row.plan)
    cluster = make_cluster(gpu=row.gpu, num_gpus=plan.world_size)
    est = estimate(model, cluster, plan)
    total = est.memory_bytes_per_gpu
    comparable = total - _outside_allocator_bytes(plan) if row.published_gib is not None else total
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
        "compared_gib": comparable / _GIB,
        "error": error,
        "called_oom": out_of_memory,
        "capacity_gib": est.memory_capacity_bytes / _GIB,
        "modelled": row.modelled,
        "note": row.note,
        "breakdown_gib": {k: v / _GIB for k, v in est.memory.as_dict().items()},
    }


def modern_rows(path: Path = MODERN) -> tuple[list[Row], dict[str, str]]:
    """Rows of the data branch's file that carry a measured peak; the others' reasons."""
    if not path.exists():
        return [], {}
    rows, skipped = [], {}
    for entry in yaml.safe_load(path.read_text()) or []:
        measured = (entry.get("measured") or {}).get("peak_memory_gib")
        if measured is None:
            continue
        try:
            rows.append(_modern_row(entry, float(measured)))
        except (KeyError, ValueError, TypeError) as e:
            skipped[str(entry.get("id"))] = f"cannot build a plan: {e}"
    return rows, skipped


def _modern_row(entry: dict[str, Any], measured: float) -> Row:
    fw = str(entry.get("framework", "megatron")).lower()
    framework = "fsdp" if fw in ("torchtitan", "fsdp", "fsdp2") else fw
    plan = {
        "framework": framework,
        "tp": int(entry.get("tp") or 1),
        "pp": int(entry.get("pp") or 1),
        "dp": int(entry["dp"]),
        "cp": int(entry.get("cp") or 1),
        "micro_batch": int(entry["micro_batch"]),
        "global_batch": int(entry["global_batch"]),
        "seq_len": int(entry["seq_len"]),
    }
    for key in ("sharding", "recompute", "precision", "schedule"):
        if entry.get(key):
            plan[key] = str(entry[key]).lower()
    if entry.get("vp"):
        plan.update(schedule="interleaved", virtual_stages=int(entry["vp"]))
    return Row(
        name=str(entry["id"]),
        source=str(entry.get("source", "")),
        model=str(entry["model"]),
        gpu=str(entry["gpu"]),
        plan=plan,
        published_gib=measured,
        includes=str((entry.get("measured") or {}).get("memory_kind", "as published")),
    )


def _markdown(results: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    scored = [r for r in results if r["modelled"] and r["error"] is not None]
    within = sum(abs(r["error"]) <= TARGET for r in scored)
    oom = [r["name"] for r in results if r["called_oom"]]
    lines = [
        "# Published peak memory vs `autotune estimate`",
        "",
        "Generated by `python benchmarks/memory_published.py`. *compared* = prediction minus CUDA context "
        "and NCCL (outside the caching allocator) when the figure is the allocator's reserved peak; "
        "*error* = compared / published - 1. Rows marked *not scored* ran with something a plan cannot "
        "express (see note) and are shown, not counted.",
        "",
        f"Scored rows within {TARGET:.0%}: {within} of {len(scored)}. Rows that ran but are called out "
        f"of memory: {len(oom)}{': ' + '; '.join(oom) if oom else ''}.",
        "",
        "| row | GPU | published | predicted | compared | error | OOM? | figure is | note |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        pub = f"{r['published_gib']:.1f}" if r["published_gib"] else "ran"
        err = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        note = r["note"] + ("" if r["modelled"] else " (not scored)")
        lines.append(
            f"| {r['name']} | {r['gpu']} | {pub} | {r['predicted_gib']:.1f} | {r['compared_gib']:.1f} "
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
