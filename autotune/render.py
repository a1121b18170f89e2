"""Human-readable text for estimates: one place, so estimate/search/explain print alike."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from autotune.costmodel import Estimate
from autotune.plan import CpComm, ParallelPlan, Precision
from autotune.specs import ModelSpec

__all__ = ["plan_summary", "format_estimate", "gib", "model_info", "params_line"]

_GIB = 1024**3

_MEMORY_ROWS = (
    ("weights_bytes", "weights"),
    ("gradients_bytes", "gradients"),
    ("optimizer_bytes", "optimizer states"),
    ("activations_bytes", "activations"),
    ("logits_bytes", "logits/loss"),
    ("prefetch_bytes", "gather buffers"),
    ("comm_buffer_bytes", "comm buckets"),
    ("reserve_bytes", "CUDA/NCCL context"),
    ("fragmentation_bytes", "allocator slack"),
)
_TIME_ROWS = (
    ("compute_s", "compute"),
    ("recompute_s", "recompute"),
    ("tp_comm_s", "TP comm"),
    ("cp_comm_s", "CP comm"),
    ("pp_p2p_s", "PP send/recv"),
    ("pp_bubble_s", "PP bubble"),
    ("dp_comm_s", "DP comm (exposed)"),
    ("optimizer_s", "optimizer step"),
    ("offload_s", "offload traffic"),
    ("overhead_s", "host overhead"),
    ("ep_comm_s", "EP all-to-all"),
)


def param_count(n: float) -> str:
    """``7.00B``, ``124M``, ``1.6M``: parameters at a precision that says something at every size."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.2f}{unit}" if unit in "TB" else f"{value:.3g}{unit}"
    return f"{n:.0f}"


def gib(num_bytes: float) -> str:
    return f"{num_bytes / _GIB:.1f} GiB"


def model_info(model: ModelSpec) -> dict[str, Any]:
    """What autotune read from a model file, for ``estimate --json`` (``model``) and the text header."""
    info: dict[str, Any] = {
        "name": model.name,
        "total_params": model.total_params,
        "active_params": model.active_params,
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "attention": "mla" if model.uses_mla else "gqa" if model.num_kv_heads < model.num_heads else "mha",
        "mlp": "gated" if model.gated_mlp else "gelu",
        "tie_embeddings": model.tie_embeddings,
        **_definition_info(model),
    }
    if model.num_local_layers:
        info.update(
            local_attention_layers=model.num_local_layers,
            attention_window=model.attention_window,
            chunked_attention=model.chunked_attention,
        )
    if model.num_linear_layers:
        info.update(
            gated_deltanet_layers=model.num_linear_layers,
            linear_heads=[model.linear_key_heads, model.linear_value_heads],
            linear_head_dims=[model.linear_key_head_dim, model.linear_value_head_dim],
        )
    if model.layer_pattern:
        info.update(
            layer_pattern=model.layer_pattern,
            mamba_layers=model.layer_pattern.count("M"),
            attention_layers=model.layer_pattern.count("*"),
            mamba_heads=[model.mamba_heads, model.mamba_head_dim],
            mamba_state=[model.mamba_groups, model.mamba_state_dim],
        )
    if model.is_moe:
        info.update(
            num_experts=model.num_experts,
            experts_per_token=model.experts_per_token,
            expert_ffn_hidden_size=model.expert_ffn_hidden_size,
            shared_ffn_hidden_size=model.shared_ffn_hidden_size,
            moe_layers=len(model.moe_layers),
            dense_layers=model.num_dense_mlp_layers,
        )
        if model.moe_latent_size:
            info["moe_latent_size"] = model.moe_latent_size
    if model.mtp_layers:
        info.update(mtp_layers=model.mtp_layers, mtp_params=model.mtp_params)
        if model.mtp_pattern:
            info.update(mtp_pattern=model.mtp_pattern, mtp_shared=model.mtp_shared)
    return info


def _definition_info(model: ModelSpec) -> dict[str, Any]:
    """What was read of the model's definition (``autotune.definition``): costless, but what the Megatron
    arguments build."""
    d = model.definition
    rope: dict[str, Any] = {"theta": d.rope.theta, "fraction": d.rope.fraction}
    if d.rope.scaling:
        rope |= {"scaling": d.rope.scaling, "factor": d.rope.factor}
    info: dict[str, Any] = {"activation": d.activation, "norm": d.norm, "norm_eps": d.norm_eps}
    info |= {"qk_norm": d.qk_norm or None, "rope": None if model.learned_positions else rope}
    if model.is_moe:
        info["router"] = asdict(d.router)
    return info


def params_line(model: ModelSpec) -> str:
    """``46.7B total, 12.9B active`` for MoE models, ``8.03B parameters`` for dense ones."""
    n, mtp = model.mtp_layers, ""
    if n:
        what = f"{n} MTP depths of one module" if model.mtp_shared and n > 1 else f"{n} MTP module"
        block = f", {model.mtp_pattern}" if model.mtp_pattern else ""
        mtp = f" + {what} ({_one_decimal(model.mtp_params)}{block})"
    if model.is_moe:
        return f"{_one_decimal(model.total_params)} total, {_one_decimal(model.active_params)} active{mtp}"
    return f"{param_count(model.num_params)} parameters{mtp}"


def _one_decimal(n: float) -> str:
    """``46.7B`` as model cards print MoE sizes; small models as ``param_count`` does."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else param_count(n)


def plan_summary(plan: ParallelPlan) -> str:
    """One line: the degrees and every knob that is not at its default, so two plans that differ print two
    lines (the global batch and sequence length have their own line)."""
    parts = [f"TP{plan.tp}", f"PP{plan.pp}", f"DP{plan.dp}"] + ([f"CP{plan.cp}"] if plan.cp > 1 else [])
    if plan.cp > 1 and plan.cp_comm is not CpComm.P2P:
        parts[-1] += f"/{plan.cp_comm}"
    parts += ([f"EP{plan.ep}"] if plan.ep > 1 else []) + ([f"ETP{plan.etp}"] if plan.etp > 1 else [])
    if plan.ep > 1 and str(plan.moe_dispatcher) != "alltoall":
        parts.append(str(plan.moe_dispatcher))
    if plan.moe_a2a_overlap:
        parts.append("a2a-overlap")
    if plan.moe_capacity_factor is not None:
        parts.append(f"drop@{plan.moe_capacity_factor:g}")
    if plan.moe_load_imbalance != 1.0:
        parts.append(f"skew{plan.moe_load_imbalance:g}")
    parts.append(f"mbs{plan.micro_batch}x{plan.num_microbatches}")
    shard = str(plan.sharding) + (f"/{plan.hsdp_shard_size}" if plan.hsdp_shard_size else "")
    parts += [
        shard,
        f"ac:{plan.recompute}"
        + (f"/{plan.recompute_layers}" if plan.recompute_layers else "")
        + (f"[{'+'.join(plan.recompute_modules)}]" if plan.recompute_modules else ""),
    ]
    if plan.sequence_parallel:
        parts.append("SP")
    if plan.pp > 1:
        parts.append(str(plan.schedule) + (f"/v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""))
    parts += _knobs(plan)
    stored = [f"{n}:{v}" for n, v in (("weights", plan.weight_dtype), ("loss", plan.loss_kernel))]
    stored = [s for s in stored if not s.endswith("fp32")]
    if plan.moment_dtype is not plan.weight_dtype:
        stored.append(f"adam:{plan.moment_dtype}")
    if plan.grad_reduce_dtype is not None:
        stored.append(f"grads:{plan.grad_reduce_dtype}")
    precision = str(plan.precision) + (f"/{plan.fp8_recipe}" if plan.precision is Precision.FP8 else "")
    parts += [precision] + stored + [str(plan.framework)]
    return " ".join(parts)


def _knobs(plan: ParallelPlan) -> list[str]:
    """The speed and memory switches that are not at their defaults, in ``plan_summary``'s words."""
    knobs = [
        (plan.offload, "offload"),
        (plan.offload_activation_layers > 0, f"offload-act:{plan.offload_activation_layers}"),
        (bool(plan.offload_modules), f"offload[{'+'.join(plan.offload_modules)}]"),
        (plan.compile, "compile"),
        (plan.async_tp, "async-TP"),
        (plan.tp_comm_overlap, "tp-overlap"),
        (not plan.overlap_grad_reduce, "no-grad-overlap"),
        (not plan.overlap_param_gather, "no-param-overlap"),
        (plan.precision_aware_optimizer, "pa-optimizer"),
    ]
    return [word for on, word in knobs if on]


def format_estimate(est: Estimate) -> str:
    plan = est.plan
    lines = [
        f"plan      {plan_summary(plan)}",
        f"batch     {plan.global_batch} sequences x {plan.seq_len} tokens = "
        f"{plan.tokens_per_step:,} tokens/step",
    ]
    verdict = "feasible" if est.feasible else "INFEASIBLE"
    lines.append(f"verdict   {verdict}; binds: {est.bottleneck}")
    lines += [f"  - {r}" for r in est.reasons]
    lines.append("")
    lines.append(
        f"memory per GPU (worst rank)        {gib(est.memory_bytes_per_gpu)} "
        f"of {gib(est.memory_capacity_bytes)}"
        f" ({est.memory_bytes_per_gpu / est.memory_capacity_bytes:.0%});"
        f" allocated {gib(est.memory.needed_bytes)}"
    )
    if est.feasible and est.memory_bytes_per_gpu > est.memory_capacity_bytes:
        lines.append(
            "  the allocated peak fits: torch's caching allocator frees its cached blocks and retries before "
            "it runs out of memory"
        )
    mem = est.memory.as_dict()
    for key, label in _MEMORY_ROWS:
        lines.append(f"  {label:<32} {mem[key] / _GIB:>9.2f} GiB")
    if est.memory.host_bytes_per_node:
        lines.append(
            f"  {'host memory per node (offload)':<32} {est.memory.host_bytes_per_node / _GIB:>9.1f} GiB"
        )
    lines.append("")
    step = est.step_time_s
    lines.append(f"step time                          {step * 1e3:,.1f} ms")
    t = est.time.as_dict()
    for key, label in _TIME_ROWS:
        if t[key]:
            lines.append(f"  {label:<32} {t[key] * 1e3:>9.1f} ms  {t[key] / step:>5.1%}")
    lines.append("")
    lines.append(
        f"throughput  {est.tokens_per_s:,.0f} tokens/s ({est.tokens_per_s_per_gpu:,.0f} per GPU), "
        f"{est.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {est.mfu:.1%}"
    )
    return "\n".join(lines)
