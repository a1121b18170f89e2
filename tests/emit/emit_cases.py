"""Named plans the emitter tests share: one per layout family the golden files pin."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from autotune.catalog import load_model, make_cluster
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec


@dataclass(frozen=True)
class Case:
    model: str
    gpus: int
    plan: dict[str, Any] = field(default_factory=dict)
    model_changes: dict[str, Any] = field(default_factory=dict)
    """Fields of the preset to change (a config.json would set them)."""

    def build(self) -> tuple[ParallelPlan, ModelSpec, ClusterSpec]:
        model = dataclasses.replace(load_model(self.model), **self.model_changes)
        return ParallelPlan(**self.plan), model, make_cluster(num_gpus=self.gpus)


CASES: dict[str, Case] = {
    "zero0": Case("7b", 8, dict(dp=8, micro_batch=2, global_batch=64, seq_len=2048, framework="deepspeed")),
    "zero1": Case(
        "7b",
        8,
        dict(dp=8, global_batch=32, seq_len=2048, sharding="zero1", precision="fp16", framework="deepspeed"),
    ),
    "zero2": Case(
        "13b",
        16,
        dict(
            dp=16, global_batch=128, seq_len=4096, sharding="zero2", recompute="full", framework="deepspeed"
        ),
    ),
    "zero3": Case(
        "70b",
        32,
        dict(
            dp=32,
            global_batch=256,
            seq_len=4096,
            sharding="zero3",
            offload=True,
            recompute="full",
            framework="deepspeed",
        ),
    ),
    "ds_ulysses": Case(
        "llama3-8b",
        16,
        dict(
            cp=4,
            dp=4,
            global_batch=16,
            seq_len=65536,
            sharding="zero3",
            recompute="full",
            cp_comm="a2a",
            framework="deepspeed",
        ),
    ),
    "ds_pipeline": Case(
        "7b",
        8,
        dict(
            pp=2,
            dp=4,
            micro_batch=2,
            global_batch=64,
            seq_len=2048,
            sharding="zero1",
            recompute="full",
            framework="deepspeed",
        ),
    ),
    "autotp": Case(
        "llama3-8b",
        8,
        dict(
            tp=2, dp=4, micro_batch=2, global_batch=64, seq_len=4096, sharding="zero2", framework="deepspeed"
        ),
    ),
    "fsdp_full": Case(
        "70b", 16, dict(tp=8, dp=2, global_batch=512, seq_len=4096, sharding="fsdp-full", recompute="full")
    ),
    "hsdp": Case(
        "llama3-8b",
        32,
        dict(dp=32, micro_batch=2, global_batch=256, seq_len=8192, sharding="hsdp", hsdp_shard_size=8),
    ),
    "fsdp_grad_op_cp_fp8": Case(
        "llama3-8b",
        16,
        dict(tp=2, cp=2, dp=4, global_batch=64, seq_len=8192, sharding="fsdp-grad-op", precision="fp8"),
    ),
    "megatron_interleaved": Case(
        "70b",
        64,
        dict(
            tp=8,
            pp=4,
            dp=2,
            global_batch=512,
            seq_len=4096,
            sharding="zero1",
            sequence_parallel=True,
            recompute="selective",
            schedule="interleaved",
            virtual_stages=5,
            framework="megatron",
        ),
    ),
    "mixtral_megatron": Case(
        "mixtral-8x7b",
        64,
        dict(
            tp=2,
            pp=4,
            dp=8,
            ep=8,
            global_batch=256,
            seq_len=4096,
            sharding="zero1",
            sequence_parallel=True,
            framework="megatron",
        ),
    ),
    "deepseek_v3_megatron": Case(
        "deepseek-v3",
        512,
        dict(
            tp=8,
            dp=64,
            ep=64,
            global_batch=4096,
            seq_len=4096,
            sharding="zero1",
            sequence_parallel=True,
            recompute="full",
            framework="megatron",
        ),
    ),
    "qwen3_megatron_tokendrop": Case(
        "qwen3-30b-a3b",
        16,
        dict(
            dp=16,
            ep=16,
            global_batch=128,
            seq_len=4096,
            sharding="zero1",
            framework="megatron",
            moe_capacity_factor=1.0,
        ),
    ),
    "gdn_megatron": Case(  # Qwen3-Next's layer pattern on a Qwen3 MoE: Gated DeltaNet on 3 of every 4 layers
        "qwen3-30b-a3b",
        16,
        dict(
            tp=2,
            dp=8,
            ep=8,
            global_batch=128,
            seq_len=4096,
            sharding="zero1",
            sequence_parallel=True,
            recompute="full",
            framework="megatron",
        ),
        model_changes=dict(
            num_linear_layers=36,
            linear_key_heads=16,
            linear_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel=4,
            attention_output_gate=True,
        ),
    ),
    "nemotron_megatron": Case(  # Nemotron 3 Nano: a hybrid pattern of Mamba-2, MoE and attention layers
        "nemotron-3-nano-30b-a3b",
        16,
        dict(
            tp=2,
            dp=8,
            ep=8,
            global_batch=128,
            seq_len=8192,
            sharding="zero1",
            sequence_parallel=True,
            recompute="selective",
            recompute_modules=("moe_act", "layernorm"),
            moe_dispatcher="hybridep",
            precision="fp8",
            framework="megatron",
        ),
    ),
    "super_megatron_kv_replicas": Case(  # Nemotron 3 Super at TP 8 over 2 KV heads (NVIDIA H100 recipe)
        "nemotron-3-super-120b-a12b",
        64,
        dict(
            tp=8,
            dp=8,
            ep=16,
            global_batch=1024,
            seq_len=8192,
            sharding="zero1",
            sequence_parallel=True,
            grad_reduce_dtype="bf16",
            framework="megatron",
        ),
    ),
    "mixtral_megatron_allgather": Case(
        "mixtral-8x7b",
        16,
        dict(
            dp=16,
            ep=8,
            global_batch=128,
            seq_len=4096,
            sharding="zero1",
            framework="megatron",
            moe_dispatcher="allgather",
        ),
    ),
    "qwen3_megatron_a2a_overlap": Case(
        "qwen3-30b-a3b",
        16,
        dict(
            pp=2,
            dp=8,
            ep=8,
            global_batch=128,
            seq_len=4096,
            sharding="zero1",
            schedule="interleaved",
            virtual_stages=2,
            framework="megatron",
            moe_a2a_overlap=True,
        ),
    ),
    "qwen3_megatron_offload_experts": Case(
        "qwen3-30b-a3b",
        16,
        dict(
            dp=16,
            ep=8,
            micro_batch=2,
            global_batch=128,
            seq_len=4096,
            sharding="zero1",
            framework="megatron",
            recompute="selective",
            recompute_modules=("moe_act", "layernorm"),
            offload_modules=("expert_fc1", "moe_act"),
        ),
    ),
    "deepseek_v3_mtp_megatron": Case(
        "deepseek-v3",
        256,
        dict(
            pp=8,
            dp=32,
            ep=32,
            global_batch=2048,
            seq_len=4096,
            sharding="zero1",
            schedule="interleaved",
            virtual_stages=2,
            recompute="full",
            framework="megatron",
        ),
        model_changes={"mtp_layers": 1},  # DeepSeek-V3's config.json: num_nextn_predict_layers 1
    ),
    "qwen3_moe_fsdp_ep": Case(
        "qwen3-30b-a3b",
        16,
        dict(dp=16, ep=8, global_batch=128, seq_len=4096, sharding="fsdp-full", recompute="full"),
    ),
    "gpt_megatron": Case(
        "gpt3-175b",
        64,
        dict(tp=8, pp=8, global_batch=64, seq_len=2048, recompute="full", framework="megatron"),
    ),
}
