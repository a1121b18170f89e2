"""ParallelPlan + ModelSpec -> Megatron-LM ``pretrain_gpt.py`` arguments (``megatron_args.txt``; pure).

Flag names are Megatron-LM's (``megatron/training/arguments.py`` and the ``TransformerConfig`` /
``ModelParallelConfig`` fields it turns into flags). The file holds one flag (with its value) per line and
nothing that needs quoting, so ``pretrain_gpt.py $(cat megatron_args.txt) <data/tokenizer flags>`` works.

Megatron's own rules, checked here before emitting: the layers split into PP x virtual stages (evenly, or
with the account-for-embedding/loss or first/last-stage flags of ``autotune/stagesplit.py``), global batch
divisible by micro-batch x DP (DP = world / (TP x PP x CP)), interleaving needs PP > 1.
"""

from __future__ import annotations

from autotune.errors import ConfigError
from autotune.plan import Framework, ParallelPlan, Precision, Recompute, Schedule, Sharding
from autotune.specs import ModelSpec
from autotune.stagesplit import ACCOUNT_BOTH, ACCOUNT_LOSS, FIRST_LAST, split_error, split_layers

__all__ = ["megatron_unsupported", "megatron_args", "megatron_args_text"]


def megatron_unsupported(plan: ParallelPlan) -> list[str]:
    """Why Megatron-LM cannot run ``plan`` as priced; [] when it can."""
    reasons: list[str] = []
    megatron_fsdp = plan.sharding is Sharding.FSDP_FULL and plan.framework is Framework.MEGATRON
    if plan.sharding not in (Sharding.NONE, Sharding.ZERO1) and not megatron_fsdp:
        reasons.append(f"Megatron's distributed optimizer shards optimizer states only, not {plan.sharding} "
                       "(fsdp-full is Megatron-FSDP for --framework megatron plans)")
    if megatron_fsdp and (plan.pp > 1 or plan.offload):
        reasons.append("Megatron-FSDP is emitted without pipelining or optimizer offload")
    if plan.pp > 1 and plan.schedule is Schedule.GPIPE:
        reasons.append("Megatron schedules pipelines with 1F1B or interleaved 1F1B, not GPipe")
    return reasons


def _model_args(model: ModelSpec, seq_len: int) -> list[list[str]]:
    args = [["--num-layers", str(model.num_layers)], ["--hidden-size", str(model.hidden_size)],
            ["--num-attention-heads", str(model.num_heads)],
            ["--ffn-hidden-size", str(model.ffn_hidden_size)], ["--seq-length", str(seq_len)],
            ["--max-position-embeddings", str(max(model.max_seq_len, seq_len))]]
    if model.num_kv_heads != model.num_heads:
        args += [["--group-query-attention"], ["--num-query-groups", str(model.num_kv_heads)]]
    if model.gated_mlp:
        args.append(["--swiglu"])
    if model.learned_positions:
        args.append(["--position-embedding-type", "learned_absolute"])
    else:
        args += [["--position-embedding-type", "rope"], ["--normalization", "RMSNorm"]]
    if not model.bias:
        args.append(["--disable-bias-linear"])
    if not model.tie_embeddings:
        args.append(["--untie-embeddings-and-output-weights"])
    return args


def _parallel_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    args = [["--tensor-model-parallel-size", str(plan.tp)], ["--pipeline-model-parallel-size", str(plan.pp)],
            ["--context-parallel-size", str(plan.cp)]]
    args += _split_args(plan, model)
    if plan.sequence_parallel:
        args.append(["--sequence-parallel"])
    if plan.sharding is Sharding.ZERO1:
        args.append(["--use-distributed-optimizer"])
    if plan.sharding is Sharding.FSDP_FULL:  # Megatron-FSDP, ZeRO-3 style (megatron/training/arguments.py)
        args += [["--use-megatron-fsdp"], ["--data-parallel-sharding-strategy", "optim_grads_params"],
                 ["--use-distributed-optimizer"]]
    if plan.offload:  # Megatron's hybrid-device optimizer rides on the precision-aware optimizer path
        args += [["--optimizer-cpu-offload"], ["--use-precision-aware-optimizer"],
                 ["--optimizer-offload-fraction", "1.0"]]
    return args


def _split_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    """Interleaving and the uneven split (megatron/training/arguments.py; ``autotune/stagesplit.py``)."""
    if plan.pp == 1:
        return []
    split = split_layers(model.num_layers, plan)
    if split.uniform:
        if plan.schedule is not Schedule.INTERLEAVED:
            return []
        return [["--num-layers-per-virtual-pipeline-stage", str(split.chunk_layers[0])]]
    args = [["--num-virtual-stages-per-pipeline-rank", str(plan.virtual_stages)]] \
        if plan.schedule is Schedule.INTERLEAVED else []
    if split.method in (ACCOUNT_BOTH, ACCOUNT_LOSS):
        args.append(["--account-for-loss-in-pipeline-split"])
    if split.method == ACCOUNT_BOTH:
        args.append(["--account-for-embedding-in-pipeline-split"])
    if split.method == FIRST_LAST:
        args += [["--decoder-first-pipeline-num-layers", str(split.first_rank_layers)],
                 ["--decoder-last-pipeline-num-layers", str(split.last_rank_layers)]]
    return args


def _recompute_and_precision_args(plan: ParallelPlan) -> list[list[str]]:
    args: list[list[str]] = []
    if plan.recompute is Recompute.SELECTIVE:
        args.append(["--recompute-granularity", "selective"])
    elif plan.recompute is Recompute.FULL and plan.recompute_layers is not None:
        args += [["--recompute-granularity", "full"], ["--recompute-method", "block"],
                 ["--recompute-num-layers", str(plan.recompute_layers)]]
    elif plan.recompute is Recompute.FULL:
        args += [["--recompute-granularity", "full"], ["--recompute-method", "uniform"],
                 ["--recompute-num-layers", "1"]]
    if plan.precision is Precision.FP16:
        args.append(["--fp16"])
    else:  # fp8 runs its GEMMs in fp8 (Transformer Engine) on top of bf16 everything else
        args.append(["--bf16"])
    if plan.precision is Precision.FP8:  # bf16 gradient reduction as NeMo's fp8 recipes (states.py)
        args += [["--fp8-format", "hybrid"], ["--fp8-amax-history-len", "1024"],
                 ["--fp8-amax-compute-algo", "max"], ["--grad-reduce-in-bf16"]]
    return args


def _check_rules(plan: ParallelPlan, model: ModelSpec) -> None:
    reason = split_error(model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework))
    if reason:
        raise ConfigError(f"Megatron: {reason}")
    if plan.global_batch % (plan.micro_batch * plan.dp):
        raise ConfigError(f"Megatron: --global-batch-size {plan.global_batch} is not divisible by "
                          f"--micro-batch-size x DP = {plan.micro_batch} x {plan.dp}")


def megatron_args(plan: ParallelPlan, model: ModelSpec) -> list[list[str]]:
    """Flag groups (``[flag]`` or ``[flag, value]``) for ``plan``; ``ConfigError`` if Megatron cannot."""
    reasons = megatron_unsupported(plan)
    if reasons:
        raise ConfigError(f"Megatron-LM cannot express this plan: {reasons[0]}")
    _check_rules(plan, model)
    batch = [["--micro-batch-size", str(plan.micro_batch)], ["--global-batch-size", str(plan.global_batch)]]
    return (_parallel_args(plan, model) + batch + _model_args(model, plan.seq_len)
            + _recompute_and_precision_args(plan))


def megatron_args_text(plan: ParallelPlan, model: ModelSpec) -> str:
    return "".join(" ".join(group) + "\n" for group in megatron_args(plan, model))
