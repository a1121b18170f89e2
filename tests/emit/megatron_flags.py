"""An argparse of the Megatron-LM flags autotune emits, with Megatron's types and choices, and Megatron's own
rules from ``megatron/training/arguments.py::validate_args`` (Megatron-LM is not installable from PyPI as a
library): shared by the tests of ``megatron_args.txt``."""

from __future__ import annotations

import argparse


def megatron_parser() -> argparse.ArgumentParser:
    """Only the flags autotune emits, with Megatron's types and choices."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in (
        "tensor-model-parallel-size",
        "pipeline-model-parallel-size",
        "context-parallel-size",
        "num-layers-per-virtual-pipeline-stage",
        "micro-batch-size",
        "global-batch-size",
        "num-layers",
        "hidden-size",
        "num-attention-heads",
        "ffn-hidden-size",
        "seq-length",
        "max-position-embeddings",
        "num-query-groups",
        "recompute-num-layers",
        "fp8-amax-history-len",
        "kv-channels",
        "num-experts",
        "moe-router-topk",
        "moe-ffn-hidden-size",
        "moe-shared-expert-intermediate-size",
        "moe-latent-size",  # a TransformerConfig field Megatron-LM 0.16.1 turns into a flag (LatentMoE)
        "expert-model-parallel-size",
        "expert-tensor-parallel-size",
        "kv-lora-rank",
        "q-lora-rank",
        "qk-head-dim",
        "qk-pos-emb-head-dim",
        "v-head-dim",
        "mtp-num-layers",
        "linear-conv-kernel-dim",
        "linear-key-head-dim",
        "linear-value-head-dim",
        "linear-num-key-heads",
        "linear-num-value-heads",
        "mamba-num-heads",
        "mamba-head-dim",
        "mamba-state-dim",
        "mamba-num-groups",
        "rotary-base",  # an int in Megatron-LM (core_v0.16.1 arguments.py)
        "rotary-seq-len-interpolation-factor",
        "moe-router-num-groups",
        "moe-router-group-topk",
    ):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--hybrid-override-pattern")  # pretrain_mamba.py's model arguments
    p.add_argument("--spec", nargs="*")
    p.add_argument("--pipeline-model-parallel-layout")
    for flag in (
        "attention-dropout",
        "hidden-dropout",
        "rotary-percent",
        "rope-scaling-factor",
        "rotary-scaling-factor",
        "mscale",
        "mscale-all-dim",
        "norm-epsilon",
        "moe-router-topk-scaling-factor",
    ):
        p.add_argument(f"--{flag}", type=float)
    p.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid"], default="softmax")
    p.add_argument("--rope-type", choices=["rope", "yarn"])
    p.add_argument("--window-size", type=lambda x: tuple(int(v) for v in x.strip("()").split(",")))
    for flag in (
        "sequence-parallel",
        "use-distributed-optimizer",
        "optimizer-cpu-offload",
        "use-precision-aware-optimizer",
        "group-query-attention",
        "swiglu",
        "disable-bias-linear",
        "add-qkv-bias",
        "untie-embeddings-and-output-weights",
        "bf16",
        "fp16",
        "tp-comm-overlap",
        "overlap-grad-reduce",
        "overlap-param-gather",
        "grad-reduce-in-bf16",
        "moe-grouped-gemm",
        "multi-latent-attention",
        "overlap-moe-expert-parallel-comm",
        "delay-wgrad-compute",
        "fine-grained-activation-offloading",
        "attention-output-gate",
        "is-hybrid-model",
        "squared-relu",
        "use-rope-scaling",
        "qk-layernorm",
        "apply-layernorm-1p",
        "openai-gelu",
        "moe-router-pre-softmax",
        "moe-router-enable-expert-bias",
        "moe-shared-expert-gate",
        "cross-entropy-loss-fusion",
        "use-megatron-fsdp",
    ):
        p.add_argument(f"--{flag}", action="store_true")
    p.add_argument(
        "--no-gradient-accumulation-fusion", action="store_false", dest="gradient_accumulation_fusion"
    )
    sharding = ["no_shard", "optim", "optim_grads", "optim_grads_params"]
    p.add_argument("--data-parallel-sharding-strategy", choices=sharding, default="no_shard")
    p.add_argument("--ckpt-format", choices=["torch", "torch_dist", "zarr", "torch_dcp", "fsdp_dtensor"])
    p.add_argument("--cross-entropy-fusion-impl", choices=["native", "te"], default="native")
    for flag in ("exp-avg-dtype", "exp-avg-sq-dtype"):  # with --use-precision-aware-optimizer only
        p.add_argument(f"--{flag}", choices=["fp32", "fp16", "bf16", "fp8"], default="fp32")
    p.add_argument("--recompute-modules", nargs="*", type=str)
    p.add_argument("--offload-modules", nargs="*", type=str)
    p.add_argument("--optimizer-offload-fraction", type=float)
    positions = ["learned_absolute", "rope", "yarn", "mrope", "relative", "none"]
    p.add_argument("--position-embedding-type", choices=positions, default="learned_absolute")
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"])
    p.add_argument("--fp8-amax-compute-algo", choices=["most_recent", "max"])
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise"])
    p.add_argument("--cp-comm-type", nargs="+", choices=["p2p", "a2a", "allgather", "a2a+p2p"])
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep"])
    p.add_argument("--moe-expert-capacity-factor", type=float)
    p.add_argument("--moe-pad-expert-input-to-capacity", action="store_true")
    p.add_argument("--moe-layer-freq", type=_moe_freq_type, default=1)
    p.add_argument("--experimental-attention-variant", choices=["gated_delta_net", "dsa"])
    p.add_argument("--linear-attention-freq", type=_moe_freq_type)
    return p


def check_definition(a: argparse.Namespace, model) -> None:
    """What defines the model beyond its shape (``autotune.definition``) reaches Megatron's arguments."""
    d = model.definition
    rope = d.rope
    if a.position_embedding_type == "rope":
        assert (a.rotary_base or 10000) == rope.theta
        assert a.use_rope_scaling == (rope.scaling == "llama3")
        assert (a.rotary_scaling_factor or 1.0) == (rope.factor if model.uses_mla else 1.0)
    assert a.qk_layernorm == (d.qk_norm == "head")
    assert (a.normalization, a.apply_layernorm_1p) == (
        "LayerNorm" if d.norm.startswith("layer") else "RMSNorm",
        d.norm.endswith("_1p"),
    )
    assert (a.squared_relu, a.openai_gelu) == (d.activation == "relu2", d.activation == "gelu_tanh")
    windowed = model.attention_window and model.num_local_layers == model.num_layers
    assert a.window_size == ((model.attention_window - 1, 0) if windowed else None)
    assert (a.norm_epsilon or 1e-5) == d.norm_eps
    r = d.router  # Megatron's defaults for a dense model
    assert (a.moe_router_score_function, a.moe_router_pre_softmax) == (r.score, r.pre_softmax)
    assert (a.moe_router_topk_scaling_factor or 1.0, a.moe_router_num_groups or 0) == (r.scale, r.groups)
    assert (a.moe_router_enable_expert_bias, a.moe_shared_expert_gate) == (r.expert_bias, r.shared_gate)


def _moe_freq_type(x: str):
    """megatron/training/arguments.py ``moe_freq_type``: an int, or a Python list expression it evaluates."""
    return eval(x) if x.startswith("[") else int(x)  # noqa: S307 - Megatron's own parsing


def check_megatron_rules(a: argparse.Namespace, world_size: int) -> None:
    model_parallel = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    assert world_size % model_parallel == 0
    dp = world_size // model_parallel
    if a.pipeline_model_parallel_layout is None:  # a layout names every chunk's layers instead
        assert a.num_layers % a.pipeline_model_parallel_size == 0
    if a.num_layers_per_virtual_pipeline_stage is not None:
        per_stage = a.num_layers // a.pipeline_model_parallel_size
        assert per_stage % a.num_layers_per_virtual_pipeline_stage == 0
        assert a.pipeline_model_parallel_size > 1  # with p2p overlap (Megatron's default)
    assert a.global_batch_size % (a.micro_batch_size * dp) == 0
    if a.recompute_granularity == "selective":
        assert a.recompute_method is None
    if a.sequence_parallel:
        assert a.tensor_model_parallel_size > 1
    if a.group_query_attention:
        assert a.num_attention_heads % a.num_query_groups == 0
    if a.optimizer_cpu_offload:
        assert a.use_precision_aware_optimizer and a.use_distributed_optimizer
    assert not (a.bf16 and a.fp16)
    if a.fp8_format:
        assert a.bf16
    if a.overlap_param_gather:  # megatron/training/arguments.py: the distributed optimizer, grad overlap
        assert a.use_distributed_optimizer and a.overlap_grad_reduce
    if a.use_megatron_fsdp:  # validate_args: its checkpoint format; its user guide's required flags
        assert a.ckpt_format == "fsdp_dtensor" and not a.gradient_accumulation_fusion
        assert a.data_parallel_sharding_strategy == "optim_grads_params" and a.use_distributed_optimizer
    if a.tp_comm_overlap:  # TE userbuffers overlap the sequence-parallel all-gather / reduce-scatter
        assert a.sequence_parallel
    if a.num_experts is not None:  # validate_args: MoE checks
        if a.tensor_model_parallel_size > 1:
            assert a.sequence_parallel
        assert a.num_experts % a.expert_model_parallel_size == 0
        freq = a.moe_layer_freq
        assert freq == 1 or (isinstance(freq, list) and len(freq) == a.num_layers)
        etp_ep = a.expert_model_parallel_size * a.expert_tensor_parallel_size
        assert world_size // a.pipeline_model_parallel_size % etp_ep == 0  # parallel_state expert grid
    if a.moe_expert_capacity_factor is not None:  # transformer_config.py: only the alltoall dispatcher
        assert a.moe_token_dispatcher_type == "alltoall"
    if a.moe_pad_expert_input_to_capacity:  # token_dispatcher.py: drop_and_pad asserts a capacity factor
        assert a.moe_expert_capacity_factor is not None
