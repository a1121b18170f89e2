"""A published training run (a row of benchmarks/data/published_runs.yaml) as the step-time model's inputs.

``row_model``, ``row_cluster`` and ``row_plan`` build (ModelSpec, ClusterSpec, ParallelPlan) from a row;
missing fields are filled only from ``ASSUMPTIONS`` (each with its source or argument); ``row_software`` gives
the software era of the run (an input, not a fit). Shared by published_runs.py and llm_analysis_compare.py.
"""

from __future__ import annotations

import re
from typing import Any

from autotune.catalog import make_cluster
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "ASSUMPTIONS",
    "ASYNC_TP_FROM_YEAR",
    "FLASH_FROM_YEAR",
    "row_cluster",
    "row_model",
    "row_plan",
    "row_software",
]

_SC21_SCRIPT = (
    "NVIDIA/Megatron-LM examples/sc21/run_table_1.sh @79a3bb6bf2 (the paper's reproduction "
    "script): MBS={mbs}, {vp}"
)
_SC21_T1 = {  # id suffix: (micro_batch, virtual_stages) from --num-layers-per-virtual-pipeline-stage
    "1.7b": (16, 1),
    "3.6b": (16, 1),
    "7.5b": (16, 1),
    "18.4b": (8, 1),
    "39.1b": (4, 1),
    "76.1b": (2, 3),
    "145.6b": (2, 2),
    "310.1b": (1, 2),
    "529.6b": (1, 3),
    "1008.0b": (1, 1),
}
_GPT2_VOCAB = (
    "vocab 51200: GPT-2 BPE (50257) padded by Megatron to a multiple of 128 x TP "
    "(--make-vocab-size-divisible-by)"
)
_V1_WHY = (
    "micro_batch = global_batch / dp: Megatron v1 (2020) had no gradient accumulation "
    "(--batch-size is per DP rank); recompute full: without it the activations alone (Korthikanti "
    "Eq. 1, 24 layers) exceed the GPU memory at this batch, and the published TFLOP/s equal Eq. 3 "
    "(which counts the recompute forward) applied to the printed iteration time"
)
_MTNLG_WHY = (
    "micro_batch 1 (not stated; the 530B model on the same Selene nodes ran MBS=1 in the "
    "Megatron SC21 scripts), recompute full (the printed 126/121/113 TFLOP/s equal Eq. 3, which "
    "counts the recompute forward, for the printed iteration times), DeepSpeed pipeline = "
    "non-interleaved 1F1B, ZeRO-1 (the only stage DeepSpeed's pipeline engine accepts); " + _GPT2_VOCAB
)
_APPC_WHY = (
    "modelled as selective recompute + SP: App. C only skips recompute for some micro-batches (+{} MFU)"
)

ASSUMPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    **{
        f"megatron-sc21-t1-{k}": (
            {"micro_batch": mbs, "virtual_stages": vp},
            _SC21_SCRIPT.format(mbs=mbs, vp=f"{vp} virtual stages" if vp > 1 else "no interleaving"),
        )
        for k, (mbs, vp) in _SC21_T1.items()
    },
    **{
        f"megatron2020-{k}": ({"micro_batch": "gbs/dp", "recompute": "full"}, _V1_WHY)
        for k in (
            "dgx2-v100-1B",
            "dgxa100-1B",
            "dgxa100-dp128-1B",
            "dgx2-v100-2B",
            "dgxa100-2B",
            "dgxa100-dp128-2B",
            "dgx2-v100-4B",
            "dgxa100-4B",
            "dgxa100-dp128-4B",
            "dgx2-v100-8B",
            "dgxa100-8B",
            "dgxa100-dp128-8B",
        )
    },
    **{
        f"mtnlg-530b-{n}gpu": (
            {"micro_batch": 1, "recompute": "full", "vocab": 51200, "zero_stage": 1},
            _MTNLG_WHY,
        )
        for n in (2240, 2800, 3360)
    },
    "megatron-readme-gpt3-175b-1024gpu": (
        {"vocab": 51200},
        _GPT2_VOCAB + "; non-interleaved 1F1B (the interleaved schedule came with the April 2021 paper)",
    ),
    "gpt-neox-20b-96gpu": (
        {"vocab": 50432},
        "vocab 50432 (GPT-NeoX-20B tokenizer as padded in its released config); TFLOP/s as Narayanan "
        "Eq. 3: gpt-neox megatron/logging.py get_flops uses it with ckpt_activations_factor 4",
    ),
    "korthikanti-appC-175B-microbatch-level-recompute": ({}, _APPC_WHY.format("0.7%")),
    "korthikanti-appC-530B-microbatch-level-recompute": ({}, _APPC_WHY.format("0.4%")),
}

FLASH_FROM_YEAR = 2023
"""Runs published before 2023 used attention kernels that materialise the ``s x s`` scores: FlashAttention
appeared in mid 2022 (Dao et al.) and reached Megatron-LM, DeepSpeed and PyTorch SDPA in 2023."""

ASYNC_TP_FROM_YEAR = 2022
"""NVIDIA Megatron-LM overlaps backward TP all-reduces with weight-gradient GEMMs since commit 16c90445e7
(2021-09-02): on for its 2022 runs (Korthikanti et al.); off for its 2020-2021 runs and for the
DeepSpeed-based forks (Megatron-DeepSpeed for BLOOM and MT-NLG, GPT-NeoX), whose Megatron code predates it."""

_GPUS = {"A100-SXM-80GB": "a100-80gb", "A100-SXM4-40GB": "a100-40gb"}


def _year(row: dict[str, Any]) -> int:
    """Publication year from the row's source (arXiv id YYMM, else the first 20xx in it); 2022 if none
    (BLOOM-176B trained March-July 2022)."""
    src = str(row.get("source", ""))
    arxiv = re.search(r"arXiv:(\d\d)\d\d\.", src)
    if arxiv:
        return 2000 + int(arxiv.group(1))
    year = re.search(r"\b(20\d\d)\b", src)
    return int(year.group(1)) if year else 2022


def row_software(row: dict[str, Any]) -> dict[str, bool]:
    """step_time's software switches for the row's era (``FLASH_FROM_YEAR``, ``ASYNC_TP_FROM_YEAR``)."""
    year = _year(row)
    nvidia_megatron = row["id"].startswith(("megatron", "korthikanti"))
    return {
        "flash_attention": year >= FLASH_FROM_YEAR,
        "tp_backward_overlap": nvidia_megatron and year >= ASYNC_TP_FROM_YEAR,
    }


def _gpu_key(row: dict[str, Any]) -> str:
    name = str(row["gpu"])
    if name in _GPUS:
        return _GPUS[name]
    if name.startswith("V100"):
        return "v100"
    if "40GB" in name:
        return "a100-40gb"
    return "a100-80gb"  # "A100 (memory size not stated)": size only moves the optimizer's HBM time


def row_cluster(row: dict[str, Any]) -> ClusterSpec:
    """Node fabric from the row's notes: Jean Zay has 4 x 100 Gb/s Omni-Path per node (same bandwidth as
    EDR IB), the GPT-NeoX servers 4 ConnectX-6 HDR HCAs; every other A100 row ran on DGX A100 nodes
    (8 x HDR 200 Gb/s), the V100 rows inside one DGX-2 (16 GPUs on NVSwitch)."""
    gpu = _gpu_key(row)
    per_node = row.get("gpus_per_node") or 8
    n = int(row["num_gpus"])
    notes = str(row.get("notes", ""))
    link, nics = None, None
    if "OmniPath" in notes:
        link, nics = "ib-edr-100", 4
    elif "4x ConnectX-6" in notes:
        link, nics = "ib-hdr-200", 4
    return make_cluster(
        num_gpus=n, gpu=gpu, gpus_per_node=min(n, per_node), inter_node=link, nics_per_node=nics
    )


def row_model(row: dict[str, Any], vocab: int) -> ModelSpec:
    h = int(row["hidden"])
    llama = "llama" in str(row["model_name"]).lower()
    heads = int(row["heads"])
    return ModelSpec(
        name=row["id"],
        hidden_size=h,
        num_layers=int(row["layers"]),
        num_heads=heads,
        num_kv_heads=int(row.get("kv_heads") or heads),
        ffn_hidden_size=int(row["ffn_hidden"]),
        vocab_size=vocab,
        max_seq_len=int(row["seq_len"]),
        tie_embeddings=not llama,
        gated_mlp=llama,
        bias=not llama,
    )


def _recompute(text: Any) -> str | None:
    if text is None:
        return None
    t = str(text).lower()
    return next((r for r in ("full", "selective", "none") if t.startswith(r)), None)


def row_plan(row: dict[str, Any], fill: dict[str, Any]) -> ParallelPlan:
    dp = int(row["dp"])
    mbs = fill.get("micro_batch", row["micro_batch"])
    if mbs == "gbs/dp":
        mbs = row["global_batch"] // dp
    vp = int(fill.get("virtual_stages") or row.get("vp") or 1)
    zero = fill.get("zero_stage", row.get("zero_stage"))
    fsdp = row.get("fsdp")
    sharding = "fsdp-full" if fsdp else {1: "zero1", 3: "zero3"}.get(zero or 0, "none")
    framework = "fsdp" if fsdp else "deepspeed" if zero == 3 else "megatron"
    precision = "fp16" if "fp16" in str(row["precision"]) and "bf16" not in str(row["precision"]) else "bf16"
    return ParallelPlan(
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        dp=dp,
        cp=int(row.get("cp") or 1),
        micro_batch=int(mbs),
        global_batch=int(row["global_batch"]),
        seq_len=int(row["seq_len"]),
        sharding=sharding,
        recompute=fill.get("recompute") or _recompute(row["recompute"]) or "none",
        sequence_parallel=bool(row.get("sequence_parallel")),
        virtual_stages=vp,
        schedule="interleaved" if vp > 1 else "1f1b",
        precision=precision,
        framework=framework,
    )
