"""ParallelPlan -> the equivalent torchtitan job-config keys (``torchtitan.toml``; pure).

Keys are those of torchtitan's TOML ``JobConfig`` as of v0.2.2, its last TOML release
(``torchtitan/config/job_config.py``; later versions configure jobs in Python): sections ``[training]``,
``[parallelism]``, ``[activation_checkpoint]`` and, for fp8, ``[model] converters`` with
``[quantize.linear.float8]``. torchtitan rejects unknown keys. ``[model]`` names the torchtitan model of the
architecture and the flavor of its shape (``torchtitan_model``, ``torchtitan_flavor``: llama3, and the
deepseek_v3 / qwen3 MoE flavors); the data and tokenizer come from the job config it is merged into.

Mapping notes:
* Batch: torchtitan accumulates ``global_batch_size / (local_batch_size x DP)`` micro-steps. Without PP,
  ``local_batch_size`` is the micro-batch; with PP, one step feeds the whole per-replica batch through the
  pipeline in micro-batches of ``pipeline_parallel_microbatch_size``.
* With TP > 1 torchtitan always applies sequence parallelism (norms run on sequence shards), so a plan
  without it gets it anyway: activations only shrink, the communication volume is the same.
* PP: ``pipeline_parallel_layers_per_stage`` = layers / (PP x virtual stages) with the first/last-stage
  discounts set to 0, so torchtitan cuts exactly PP x virtual stages equal chunks (embedding on the first,
  norm and output on the last), as the cost model assumes. Where PP x virtual stages does not divide the
  layers, ``module_fqns_per_model_part`` names each chunk's modules as torchtitan's own
  ``generate_llm_fqn_per_model_part`` (embedding and output weighing one layer) would, which
  ``autotune/stagesplit.py`` reproduces for the cost model.
* EP / ETP: ``expert_parallel_degree`` / ``expert_tensor_parallel_degree`` (0.2.2 ``Parallelism``); EP
  borrows its ranks from ``dp_shard x cp`` (and TP when ETP is 1), as ``plan.py`` checks. A DeepEP plan
  sets ``expert_parallel_comm_backend = "deepep"`` (0.2.2; the DeepEP kernels must be installed).
* ``selective`` recompute maps to per-op SAC (``selective_ac_option = "op"``): matmul and attention outputs
  are kept, cheap element-wise ops recomputed.
"""

from __future__ import annotations

from typing import Any

from autotune.emit.deepspeed import GRADIENT_CLIPPING
from autotune.errors import ConfigError
from autotune.plan import (
    FP8_RECIPES,
    MOE_DISPATCHERS,
    CpComm,
    Framework,
    LossKernel,
    MoeDispatcher,
    ParallelPlan,
    Precision,
    Recompute,
    Sharding,
    StoreDtype,
    expert_errors,
)
from autotune.specs import ModelSpec
from autotune.stagesplit import split_layers

__all__ = [
    "torchtitan_unsupported",
    "to_torchtitan_config",
    "dumps_toml",
    "torchtitan_flavor",
    "torchtitan_model_unsupported",
    "torchtitan_model",
]

LLAMA3_FLAVORS = {
    "8B": (4096, 32, 32, 8, 14336, 128256),
    "70B": (8192, 80, 64, 8, 28672, 128256),
    "405B": (16384, 126, 128, 8, 53248, 128256),
}
"""torchtitan 0.2.2 ``torchtitan/models/llama3/__init__.py::llama3_args``: flavor -> (dim, layers, heads,
KV heads, FFN width as its ``FeedForward`` rounds it, vocabulary); a test builds each and compares."""
MOE_FLAVORS = {
    ("deepseek_v3", "16B"): (2048, 27, 16, 16, 1408, 64, 6, 102400),
    ("deepseek_v3", "236B"): (5120, 60, 128, 128, 1536, 160, 6, 102400),
    ("deepseek_v3", "671B"): (7168, 61, 128, 128, 2048, 256, 8, 129280),
    ("qwen3", "30B-A3B"): (2048, 48, 32, 4, 768, 128, 8, 151936),
    ("qwen3", "235B-A22B"): (4096, 94, 64, 4, 1536, 128, 8, 151936),
}
"""torchtitan 0.2.2's registered MoE flavors (``models/deepseek_v3/__init__.py::deepseekv3_args``,
``models/qwen3/__init__.py::qwen3_args``): (model, flavor) -> (dim, layers, heads, KV heads (MLA: the heads),
routed expert width, routed experts, top-k, vocabulary)."""
FLAVOR_DEFINITIONS = {
    "llama3": (500000.0, "", "rms_norm", "silu"),
    "qwen3": (1000000.0, "head", "rms_norm", "silu"),
    "deepseek_v3": (10000.0, "", "rms_norm", "silu"),
}
"""What every flavor of a torchtitan 0.2.2 model builds beyond its shape (``model/args.py``: ``rope_theta``,
Qwen3's ``qk_norm``, RMSNorm, SwiGLU): a model of a flavor's shape that differs here is not that flavor."""
REGISTRIES = {"llama3": "llama3_args", "deepseek_v3": "deepseekv3_args", "qwen3": "qwen3_args"}
"""Where a flavor of each torchtitan model is registered (``torchtitan/models/<model>/__init__.py``)."""

_RESHARD = {Sharding.FSDP_GRAD_OP: "never", Sharding.NONE: "default"}


def torchtitan_unsupported(plan: ParallelPlan) -> list[str]:
    """Why torchtitan cannot run ``plan`` as priced; [] when it can."""
    reasons: list[str] = expert_errors(plan, Framework.FSDP)
    if plan.moe_capacity_factor is not None:
        reasons.append("torchtitan's MoE routes dropless: it has no capacity factor")
    if plan.ep > 1 and plan.moe_dispatcher not in MOE_DISPATCHERS[Framework.FSDP]:
        reasons.append(
            f"torchtitan dispatches tokens all-to-all or by DeepEP; the plan was priced with Megatron's "
            f"{plan.moe_dispatcher}"
        )
    if plan.moe_a2a_overlap:
        reasons.append(
            "the plan was priced with Megatron's EP all-to-all overlap, which torchtitan does not run"
        )
    if plan.ep > 1 and plan.etp > 1 and plan.moe_dispatcher is MoeDispatcher.DEEPEP:
        reasons.append("torchtitan runs DeepEP with ETP 1 only (parallelize_deepseekv3 raises otherwise)")
    if plan.precision is Precision.FP8 and plan.fp8_recipe not in FP8_RECIPES[Framework.FSDP]:
        reasons.append(f"torchtitan has no {plan.fp8_recipe} fp8 recipe (float8 tensorwise / rowwise, MXFP8)")
    mx = plan.precision is Precision.FP8 and str(plan.fp8_recipe) == "mx"
    if mx and plan.tp > 1 and plan.compile:  # torchtitan components/quantization/mx.py asserts it
        reasons.append("torchtitan's MXFP8 does not run TP under torch.compile (drop --compile or TP)")
    if plan.sharding in (Sharding.ZERO1, Sharding.ZERO2):
        reasons.append(f"FSDP2 has no {plan.sharding} (optimizer-only or gradient-only) sharding")
    if plan.sharding is Sharding.NONE and plan.dp > 1 and plan.world_size > plan.dp:
        reasons.append("torchtitan's DDP (replicate without sharding) does not compose with TP/PP/CP")
    if plan.sharding is Sharding.NONE and plan.cp > 1:  # parallel_dims.py: the fsdp mesh is dp_shard x cp
        reasons.append("torchtitan shards the model states over CP whenever CP > 1 (--sharding fsdp-full)")
    if plan.offload:
        reasons.append("enable_cpu_offload moves parameters and gradients too, not only the optimizer states")
    if plan.precision is Precision.FP16:
        reasons.append("torchtitan trains in bf16 or fp32 (mixed_precision_param has no fp16)")
    if plan.cp > 1 and plan.cp_comm is CpComm.A2A:
        reasons.append("torchtitan rotates K/V for CP (p2p, allgather); it has no Ulysses a2a")
    if StoreDtype.BF16 in (plan.weight_dtype, plan.moment_dtype):
        reasons.append("torchtitan keeps fp32 weights and AdamW moments (mixed_precision_param casts them)")
    compiled = plan.compile and plan.loss_kernel is LossKernel.FUSED  # torchtitan compiles its loss
    if plan.loss_kernel is not LossKernel.FP32 and not compiled:
        reasons.append("torchtitan's cross-entropy upcasts the logits to fp32 (components/loss.py)")
    return reasons


def torchtitan_model_unsupported(model: ModelSpec, plan: ParallelPlan | None = None) -> list[str]:
    """Why torchtitan 0.2.2 has no model for ``model``'s architecture, or (``plan``) does not run the plan
    in it: DeepEP is wired into its deepseek_v3 model only (``moe_impl`` from
    ``expert_parallel_comm_backend``, models/deepseek_v3/model/args.py; its qwen3 MoE ignores the key and
    dispatches all-to-all); its qwen3 has no pipelining function; ``parallelize_deepseekv3`` refuses float8
    tensorwise with TP, and context parallelism beside the FlexAttention its flavors run. [] when it runs."""
    if model.num_linear_layers:
        return ["torchtitan 0.2.2 has no Gated DeltaNet model (its models: llama3, qwen3, deepseek_v3, ...)"]
    if model.layer_pattern:
        return ["torchtitan 0.2.2 has no hybrid Mamba-2 model (its models: llama3, qwen3, deepseek_v3, ...)"]
    if model.moe_latent_size:
        return ["torchtitan 0.2.2 has no LatentMoE model (its models: llama3, qwen3, deepseek_v3, ...)"]
    if plan is None:
        return []
    name = torchtitan_model(model)
    if plan.ep > 1 and plan.moe_dispatcher is MoeDispatcher.DEEPEP and name != "deepseek_v3":
        return [f"torchtitan 0.2.2 runs DeepEP in its deepseek_v3 model only, not {name}"]
    if plan.pp > 1 and name == "qwen3":  # models/qwen3/__init__.py: pipelining_fn=None
        return ["torchtitan 0.2.2's qwen3 MoE model has no pipelining: use --pp 1"]
    fp8_tensorwise = plan.precision is Precision.FP8 and str(plan.fp8_recipe) == "tensorwise"
    if fp8_tensorwise and plan.tp > 1 and name == "deepseek_v3":  # parallelize_deepseekv3 raises it
        return ["torchtitan 0.2.2's deepseek_v3 refuses float8 tensorwise with TP: use rowwise or TP 1"]
    if plan.cp > 1 and name == "deepseek_v3":  # its flavors set attn_type "flex"; model/args.py raises
        return ["torchtitan 0.2.2's deepseek_v3 flavors run FlexAttention, which its CP refuses: use --cp 1"]
    return []


def _dp_degrees(plan: ParallelPlan) -> tuple[int, int]:
    """(replicate, shard) degrees."""
    if plan.sharding is Sharding.NONE:
        return plan.dp, 1
    shard = plan.shard_degree
    return plan.dp // shard, shard


def _parallelism(plan: ParallelPlan, model: ModelSpec) -> dict[str, Any]:
    replicate, shard = _dp_degrees(plan)
    out: dict[str, Any] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": _RESHARD.get(plan.sharding, "always"),
        "tensor_parallel_degree": plan.tp,
        "enable_async_tensor_parallel": plan.async_tp,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
    }
    if plan.cp > 1:  # p2p: K/V rotated shard by shard; allgather: gathered at once
        rotate = "allgather" if str(plan.cp_comm) == "allgather" else "alltoall"
        out["context_parallel_rotate_method"] = rotate
    if plan.ep > 1 or plan.etp > 1:
        out["expert_parallel_degree"] = plan.ep
        out["expert_tensor_parallel_degree"] = plan.etp
    if plan.ep > 1 and plan.moe_dispatcher is MoeDispatcher.DEEPEP:
        out["expert_parallel_comm_backend"] = "deepep"
    if plan.pp > 1:
        out["pipeline_parallel_schedule"] = plan.schedule.torch_name
        split = split_layers(model.num_layers, plan)
        if split.uniform:
            out["pipeline_parallel_layers_per_stage"] = split.chunk_layers[0]
            out["pipeline_parallel_first_stage_less_layers"] = 0
            out["pipeline_parallel_last_stage_less_layers"] = 0
        else:
            out["module_fqns_per_model_part"] = _module_fqns(split.chunk_layers)
        out["pipeline_parallel_microbatch_size"] = plan.micro_batch
    return out


def _module_fqns(chunk_layers: tuple[int, ...]) -> list[list[str]]:
    """torchtitan Llama module names per model chunk: ``tok_embeddings`` first, ``norm``/``output`` last."""
    parts, start = [], 0
    for layers in chunk_layers:
        parts.append([f"layers.{i}" for i in range(start, start + layers)])
        start += layers
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _training(plan: ParallelPlan) -> dict[str, Any]:
    local = plan.global_batch // plan.dp if plan.pp > 1 else plan.micro_batch
    return {
        "local_batch_size": local,
        "global_batch_size": plan.global_batch,
        "seq_len": plan.seq_len,
        "max_norm": GRADIENT_CLIPPING,
        "mixed_precision_param": "bfloat16",
        "mixed_precision_reduce": "float32",
    }


def torchtitan_model(model: ModelSpec) -> str:
    """The torchtitan model that trains ``model``'s architecture: ``deepseek_v3`` for MLA experts, ``qwen3``
    (torchtitan's grouped-query MoE) for other experts, ``llama3`` for dense models."""
    if model.is_moe:
        return "deepseek_v3" if model.uses_mla else "qwen3"
    return "llama3"


def torchtitan_flavor(model: ModelSpec) -> str | None:
    """The registered flavor of ``torchtitan_model(model)`` with ``model``'s shape and definition
    (``FLAVOR_DEFINITIONS``), or None: the fragment then
    gives the model's name as flavor and torchtitan stops on an unknown flavor until one is registered,
    instead of training its debug model."""
    d = model.definition
    if (d.rope.theta, d.qk_norm, d.norm, d.activation) != FLAVOR_DEFINITIONS[torchtitan_model(model)]:
        return None
    base = (model.hidden_size, model.num_layers, model.num_heads, model.num_kv_heads)
    if model.is_moe:
        experts = (model.expert_ffn_hidden_size, model.num_experts, model.experts_per_token)
        moe_shape, family = (*base, *experts, model.vocab_size), torchtitan_model(model)
        return next((f for (m, f), dims in MOE_FLAVORS.items() if (m, dims) == (family, moe_shape)), None)
    shape = (*base, model.ffn_hidden_size, model.vocab_size)
    return next((name for name, dims in LLAMA3_FLAVORS.items() if dims == shape), None)


def to_torchtitan_config(plan: ParallelPlan, model: ModelSpec) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` for ``plan``; ``ConfigError`` if torchtitan cannot express it."""
    reasons = torchtitan_unsupported(plan) + torchtitan_model_unsupported(model, plan)
    if reasons:
        raise ConfigError(f"torchtitan cannot express this plan: {reasons[0]}")
    ac: dict[str, Any] = {"mode": str(plan.recompute)}
    if plan.recompute is Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    flavor = torchtitan_flavor(model) or model.name
    cfg: dict[str, dict[str, Any]] = {
        "model": {"name": torchtitan_model(model), "flavor": flavor},
        "training": _training(plan),
        "parallelism": _parallelism(plan, model),
        "activation_checkpoint": ac,
    }
    if plan.compile:
        cfg["compile"] = {"enable": True, "components": ["model", "loss"]}
    if plan.precision is Precision.FP8:
        float8 = _float8(plan)
        cfg["model"].update(float8.pop("model"))
        cfg.update(float8)
    return cfg


def _float8(plan: ParallelPlan) -> dict[str, dict[str, Any]]:
    """torchao float8 linears (``[quantize.linear.float8]``) or MXFP8 (``[quantize.linear.mx]``). Tensorwise
    scaling is the converter's path without a ``recipe_name``, the only one that all-gathers fp8 weights under
    FSDP: ``Float8LinearConverter`` asserts that a ``recipe_name`` comes without
    ``enable_fsdp_float8_all_gather`` (torchtitan components/quantization/float8.py, v0.2.2)."""
    if str(plan.fp8_recipe) == "mx":
        return {
            "model": {"converters": ["quantize.linear.mx"]},
            "quantize.linear.mx": {"recipe_name": "mxfp8_cublas"},
        }
    if str(plan.fp8_recipe) != "tensorwise":
        float8: dict[str, Any] = {"recipe_name": str(plan.fp8_recipe)}
    else:
        sharded = _dp_degrees(plan)[1] > 1
        float8 = {
            "enable_fsdp_float8_all_gather": sharded,
            "precompute_float8_dynamic_scale_for_fsdp": sharded,
        }
    return {"model": {"converters": ["quantize.linear.float8"]}, "quantize.linear.float8": float8}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def dumps_toml(cfg: dict[str, dict[str, Any]], *, header: str = "") -> str:
    """TOML for one level of tables of scalars and lists (all a job config needs)."""
    lines = [f"# {line}" for line in header.splitlines()]
    for section, values in cfg.items():
        lines += ["", f"[{section}]"] + [f"{key} = {_toml_value(v)}" for key, v in values.items()]
    return "\n".join(lines).lstrip("\n") + "\n"
