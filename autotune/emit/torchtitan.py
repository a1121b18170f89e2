"""ParallelPlan -> the equivalent torchtitan job-config keys (``torchtitan.toml``; pure).

Keys are those of torchtitan's TOML ``JobConfig`` as of v0.2.2, its last TOML release
(``torchtitan/config/job_config.py``; later versions configure jobs in Python): sections ``[training]``,
``[parallelism]``, ``[activation_checkpoint]`` and, for fp8, ``[model] converters`` with
``[quantize.linear.float8]``. torchtitan rejects unknown keys. The file is a fragment to merge into a job
config that names the model (``[model] name/flavor``) and the data.

Mapping notes:
* Batch: torchtitan accumulates ``global_batch_size / (local_batch_size x DP)`` micro-steps. Without PP,
  ``local_batch_size`` is the micro-batch; with PP, one step feeds the whole per-replica batch through the
  pipeline in micro-batches of ``pipeline_parallel_microbatch_size``.
* With TP > 1 torchtitan always applies sequence parallelism (norms run on sequence shards), so a plan
  without it gets it anyway: activations only shrink, the communication volume is the same.
* PP: ``pipeline_parallel_layers_per_stage`` = layers / (PP x virtual stages) with the first/last-stage
  discounts set to 0, so torchtitan cuts exactly PP x virtual stages equal chunks (embedding on the first,
  norm and output on the last), as the cost model assumes.
* EP / ETP: ``expert_parallel_degree`` / ``expert_tensor_parallel_degree`` (0.2.2 ``Parallelism``); EP
  borrows its ranks from ``dp_shard x cp`` (and TP when ETP is 1), as ``plan.py`` checks.
* ``selective`` recompute maps to per-op SAC (``selective_ac_option = "op"``): matmul and attention outputs
  are kept, cheap element-wise ops recomputed.
"""

from __future__ import annotations

from typing import Any

from autotune.emit.deepspeed import GRADIENT_CLIPPING
from autotune.errors import ConfigError
from autotune.plan import Framework, ParallelPlan, Precision, Recompute, Schedule, Sharding, expert_errors
from autotune.specs import ModelSpec

__all__ = ["torchtitan_unsupported", "to_torchtitan_config", "dumps_toml"]

_SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B", Schedule.INTERLEAVED: "Interleaved1F1B"}
_RESHARD = {Sharding.FSDP_GRAD_OP: "never", Sharding.NONE: "default"}


def torchtitan_unsupported(plan: ParallelPlan) -> list[str]:
    """Why torchtitan cannot run ``plan`` as priced; [] when it can."""
    reasons: list[str] = expert_errors(plan, Framework.FSDP)
    if plan.sharding in (Sharding.ZERO1, Sharding.ZERO2):
        reasons.append(f"FSDP2 has no {plan.sharding} (optimizer-only or gradient-only) sharding")
    if plan.sharding is Sharding.NONE and plan.dp > 1 and plan.world_size > plan.dp:
        reasons.append("torchtitan's DDP (replicate without sharding) does not compose with TP/PP/CP")
    if plan.offload:
        reasons.append("enable_cpu_offload moves parameters and gradients too, not only the optimizer states")
    if plan.precision is Precision.FP16:
        reasons.append("torchtitan trains in bf16 or fp32 (mixed_precision_param has no fp16)")
    return reasons


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
        "enable_async_tensor_parallel": False,
        "pipeline_parallel_degree": plan.pp,
        "context_parallel_degree": plan.cp,
    }
    if plan.ep > 1 or plan.etp > 1:
        out["expert_parallel_degree"] = plan.ep
        out["expert_tensor_parallel_degree"] = plan.etp
    if plan.pp > 1:
        out["pipeline_parallel_schedule"] = _SCHEDULES[plan.schedule]
        out["pipeline_parallel_layers_per_stage"] = model.num_layers // (plan.pp * plan.virtual_stages)
        out["pipeline_parallel_first_stage_less_layers"] = 0
        out["pipeline_parallel_last_stage_less_layers"] = 0
        out["pipeline_parallel_microbatch_size"] = plan.micro_batch
    return out


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


def to_torchtitan_config(plan: ParallelPlan, model: ModelSpec) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` for ``plan``; ``ConfigError`` if torchtitan cannot express it."""
    reasons = torchtitan_unsupported(plan)
    if reasons:
        raise ConfigError(f"torchtitan cannot express this plan: {reasons[0]}")
    ac: dict[str, Any] = {"mode": str(plan.recompute)}
    if plan.recompute is Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    cfg: dict[str, dict[str, Any]] = {"training": _training(plan), "parallelism": _parallelism(plan, model),
                                      "activation_checkpoint": ac}
    if plan.precision is Precision.FP8:  # torchao float8 linears; tensorwise scaling suits fp8 all-gathers
        cfg["model"] = {"converters": ["quantize.linear.float8"]}
        sharded = _dp_degrees(plan)[1] > 1
        cfg["quantize.linear.float8"] = {"recipe_name": "tensorwise",
                                         "enable_fsdp_float8_all_gather": sharded,
                                         "precompute_float8_dynamic_scale_for_fsdp": sharded}
    return cfg


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
