"""Apply a ParallelPlan to the trial model with PyTorch-native parallelism.

``parallelize(model, *, plan, mesh)`` is one linear, keyword-only sequence:
``apply_tp -> apply_ac -> apply_dp``. Pipeline parallelism comes first and from outside: the model is
split into stage chunks by layers (``split_stages``) and each chunk is parallelized on its own, then
``build_schedule`` wraps the chunks in ``torch.distributed.pipelining`` stages.

The device mesh follows the plan's rank order (``autotune.plan``: pp, dp, cp, tp outermost to
innermost), with the DP axis split into ``dp_replicate x dp_shard`` (HSDP; pure replication is
``dp x 1``, FSDP is ``1 x dp``). Expert parallelism folds into DP: a second mesh ``pp x edp x ep``
(``build_expert_mesh``) puts each EP group on consecutive DP ranks (inside ``dp_shard``, where torchtitan
borrows it) and the ranks that hold the same experts on ``edp``; MoE models run with TP = 1 here.

Only torch is imported: this module runs where optuna and deepspeed are not installed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autotune.errors import TrialError
from autotune.plan import MoeDispatcher, ParallelPlan, Recompute, Sharding
from autotune.stagesplit import split_layers
from autotune.trials.model import Transformer
from autotune.trials.moe import GroupedExperts, MoE, apply_ep

__all__ = [
    "MESH_DIMS",
    "build_mesh",
    "build_expert_mesh",
    "dp_degrees",
    "parallelize",
    "apply_tp",
    "apply_ac",
    "apply_dp",
    "end_units",
    "wraps_data_parallel",
    "split_stages",
    "build_schedule",
]

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The plan's ``pp, dp, cp, tp`` order with DP split for HSDP (``dp_replicate`` outer)."""


def dp_degrees(plan: ParallelPlan) -> tuple[int, int]:
    """``(dp_replicate, dp_shard)``: replicas x ranks that shard one replica's states."""
    if plan.sharding is Sharding.HSDP:
        assert plan.hsdp_shard_size is not None
        return plan.dp // plan.hsdp_shard_size, plan.hsdp_shard_size
    if plan.sharding is Sharding.NONE:
        return plan.dp, 1
    return 1, plan.dp


def build_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh:
    replicate, shard = dp_degrees(plan)
    shape = (plan.pp, replicate, shard, plan.cp, plan.tp)
    return init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)


def build_expert_mesh(plan: ParallelPlan, device_type: str) -> DeviceMesh | None:
    """``(pp, edp, ep)`` over the same ranks as ``build_mesh`` (TP = CP = 1); None without EP."""
    if plan.ep == 1:
        return None
    if plan.dp % plan.ep or plan.tp * plan.cp > 1:
        raise TrialError(
            f"EP {plan.ep} runs over DP ranks in real trials: it must divide DP {plan.dp}, with TP = CP = 1"
        )
    return init_device_mesh(
        device_type, (plan.pp, plan.dp // plan.ep, plan.ep), mesh_dim_names=("pp", "edp", "ep")
    )


def wraps_data_parallel(plan: ParallelPlan, *, fsdp_at_dp1: bool = False) -> bool:
    """True when ``apply_dp`` wraps the model (and so owns mixed precision through its policy)."""
    return plan.dp > 1 or fsdp_at_dp1


def parallelize(
    model: nn.Module,
    *,
    plan: ParallelPlan,
    mesh: DeviceMesh,
    param_dtype: torch.dtype | None = None,
    fsdp_at_dp1: bool = False,
    expert_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """EP, TP, then activation checkpointing, then data parallelism, in place; returns ``model``.

    ``param_dtype``: compute dtype under FSDP's mixed-precision policy (None: keep fp32).
    ``fsdp_at_dp1``: validation only; wrap with ``fully_shard`` even on one rank, to measure FSDP2's
    own cost (a ParallelPlan forbids sharding at DP=1, so this cannot come from the plan).
    ``expert_mesh``: ``build_expert_mesh(plan)``, needed when ``plan.ep > 1``.
    """
    if plan.cp > 1:
        raise TrialError("context parallelism is not implemented in real trials; use CP=1")
    if plan.etp > 1:
        raise TrialError("expert tensor parallelism is not implemented in real trials; use ETP=1")
    if plan.ep > 1 and plan.moe_dispatcher is not MoeDispatcher.ALLTOALL:
        raise TrialError(f"the trial MoE exchanges tokens all-to-all, not by {plan.moe_dispatcher}")
    if plan.tp > 1 and any(isinstance(m, MoE) for m in model.modules()):
        raise TrialError("MoE layers are not tensor-parallel in real trials; use TP=1 (EP splits experts)")
    if plan.ep > 1:
        assert expert_mesh is not None, "EP > 1 needs build_expert_mesh(plan)"
        apply_ep(model, group=expert_mesh.get_group("ep"), ep=plan.ep, rank=expert_mesh.get_local_rank("ep"))
    if plan.tp > 1:
        apply_tp(model, mesh["tp"], sequence_parallel=plan.sequence_parallel)
    # AC after TP: the checkpointed forward must be the tensor-parallel one, so the recomputation in
    # backward replays the TP collectives instead of a whole-layer computation.
    if plan.recompute is not Recompute.NONE:
        apply_ac(model, plan.recompute)
    # DP last: fully_shard/replicate must see the final module tree (TP DTensors, checkpoint wrappers)
    # to shard each block as one unit and to lay parameters out on the 2-D (dp, tp) mesh.
    if wraps_data_parallel(plan, fsdp_at_dp1=fsdp_at_dp1):
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        apply_dp(model, mesh, plan=plan, mp_policy=mp, fsdp_at_dp1=fsdp_at_dp1, expert_mesh=expert_mesh)
    return model


def _block_tp_plan(block: nn.Module, *, sequence_parallel: bool) -> dict[str, object]:
    sp = sequence_parallel
    out = Shard(1) if sp else Replicate()
    mlp_in = ["mlp.up_proj"] + (["mlp.gate_proj"] if block.mlp.gate_proj is not None else [])
    layer_plan: dict[str, object] = {
        **{f"self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")},
        "self_attn.o_proj": RowwiseParallel(output_layouts=out),
        **{n: ColwiseParallel() for n in mlp_in},
        "mlp.down_proj": RowwiseParallel(output_layouts=out),
    }
    # The attention and MLP inputs enter as one replicated DTensor (with SP: all-gathered from sequence
    # shards), so the column-parallel projections' partial input gradients add up as DTensors and are reduced
    # once per sub-layer in backward (as torchtitan's plan does), not once per projection (q, k, v, gate, up:
    # 5 all-reduces per block instead of 2, counted with CommDebugMode on tiny; tests/trials/test_tp_comm.py).
    entry = PrepareModuleInput(input_layouts=(out,), desired_input_layouts=(Replicate(),))
    layer_plan |= {"self_attn": entry, "mlp": copy.deepcopy(entry)}
    if sp:  # norms run on sequence shards
        layer_plan |= {"input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel()}
    return layer_plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Megatron TP (Shoeybi et al. 2019): Q/K/V and gate/up column-parallel, O and down row-parallel;
    vocabulary-parallel embedding and head. With SP, the residual stream is sharded on the sequence."""
    sp = sequence_parallel
    residual = Shard(1) if sp else Replicate()  # layout of the hidden states between blocks
    top: dict[str, object] = {}
    if getattr(model, "embed_tokens", None) is not None:
        top["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
        if sp and getattr(model, "embed_positions", None) is not None:  # [seq, h]: the sequence is dim 0
            top["embed_positions"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    if getattr(model, "lm_head", None) is not None:
        if sp:
            top["norm"] = SequenceParallel()
        top["lm_head"] = ColwiseParallel(input_layouts=residual, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_tp_plan(block, sequence_parallel=sp))


def apply_ac(
    model: nn.Module,
    recompute: Recompute,
    *,
    slots: list[tuple[nn.Module, str]] | None = None,
    selective: tuple[str, ...] = ("self_attn.core",),
) -> None:
    """Full: checkpoint each block. Selective (Korthikanti et al. 2022 Sec. 4.2): checkpoint only the
    attention core (rotary + SDPA), keeping the projections' outputs.

    ``slots``: ``(parent, name)`` of each block (default: the trial model's ``layers``); ``selective``: the
    submodules, relative to a block, that selective recompute checkpoints."""
    for parent, name in slots if slots is not None else [(model.layers, k) for k in model.layers]:
        block = getattr(parent, name)
        if recompute is Recompute.FULL:
            setattr(parent, name, checkpoint_wrapper(block, preserve_rng_state=False))
        elif recompute is Recompute.SELECTIVE:
            for path in selective:
                owner, _, leaf = path.rpartition(".")
                holder = block.get_submodule(owner)
                setattr(holder, leaf, checkpoint_wrapper(getattr(holder, leaf), preserve_rng_state=False))


def apply_dp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    plan: ParallelPlan,
    mp_policy: MixedPrecisionPolicy,
    fsdp_at_dp1: bool = False,
    blocks: list[nn.Module] | None = None,
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """FSDP2 units as torchtitan wraps a decoder (torchtitan/distributed/fsdp.py ``apply_fsdp_to_decoder``,
    since 83e694105): the embeddings, then the final norm with the head, then each block, then the root,
    which is left holding nothing of the trial model; tied embeddings make the two ends one unit (a
    parameter belongs to one unit). fsdp-full reshards every unit after forward (ZeRO-3; torchtitan's
    ``fsdp_reshard_after_forward = "always"``, what autotune emits), fsdp-grad-op keeps parameters gathered
    until backward (ZeRO-2-like, ``"never"``), HSDP shards inside ``dp_shard`` and replicates over
    ``dp_replicate``; sharding ``none`` is DDP-style replication (per block, then the root).
    ``blocks``: the block units (default: the trial model's ``layers``); a user's model passed with its own
    ``blocks`` keeps everything else in the root.
    ``expert_mesh`` (EP > 1): each block's routed experts are wrapped first, alone, over its ``edp`` ranks
    (torchtitan ``apply_fsdp``: experts on the expert-DP mesh, router and shared expert with the block)."""
    ends = end_units(model) if blocks is None else []
    blocks = list(model.layers.values()) if blocks is None else blocks
    if plan.sharding is Sharding.NONE and not fsdp_at_dp1:
        if expert_mesh is not None:
            for experts in _routed_experts(blocks):
                _apply_replicate(experts, expert_mesh["edp"], mp_policy, [])
        _apply_replicate(model, mesh["dp_replicate"], mp_policy, blocks)
        return
    dp_mesh = mesh["dp_replicate", "dp_shard"] if plan.sharding is Sharding.HSDP else mesh["dp_shard"]
    reshard = plan.sharding is not Sharding.FSDP_GRAD_OP
    kwargs: dict[str, object] = {"mesh": dp_mesh, "reshard_after_forward": reshard, "mp_policy": mp_policy}
    if plan.offload and dp_mesh.device_type == "cuda":
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs["offload_policy"] = CPUOffloadPolicy()
    if expert_mesh is not None:
        for experts in _routed_experts(blocks):
            fully_shard(experts, **(kwargs | {"mesh": expert_mesh["edp"]}))
    for unit in ends:
        fully_shard(unit, **kwargs)
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)


def end_units(model: nn.Module) -> list[list[nn.Module]]:
    """The trial model's ends as FSDP2 units, as torchtitan groups them: ``[embeddings]`` and
    ``[norm, head]``, or one ``[embeddings, norm, head]`` when the head shares the embedding's weight; a
    pipeline stage has the ends it holds (``split_stages``)."""
    if not isinstance(model, Transformer):
        return []
    embed = [m for m in (model.embed_tokens, model.embed_positions) if m is not None]
    head = [m for m in (model.norm, model.lm_head) if m is not None]
    if embed and head and model.spec.tie_embeddings:
        return [embed + head]
    return [unit for unit in (embed, head) if unit]


def _routed_experts(blocks: list[nn.Module]) -> list[nn.Module]:
    return [m for block in blocks for m in block.modules() if isinstance(m, GroupedExperts)]


def _apply_replicate(
    model: nn.Module, dp_mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy, blocks: list[nn.Module]
) -> None:
    # FSDP2-style replicate (torch >= 2.10) handles TP DTensor parameters; bucketed per block like DDP.
    from torch.distributed._composable.replicate_with_fsdp import replicate

    for block in blocks:
        replicate(block, mesh=dp_mesh, mp_policy=mp_policy)
    replicate(model, mesh=dp_mesh, mp_policy=mp_policy)


def split_stages(model: Transformer, *, plan: ParallelPlan, pp_rank: int) -> list[tuple[int, Transformer]]:
    """This rank's pipeline chunks as ``(stage_index, module)``, split by whole layers.

    With ``v`` virtual stages there are ``pp * v`` chunks; rank ``r`` holds stages ``r, r + pp, ...``
    (looped placement, Narayanan et al. 2021 Sec. 2.2), or ``r`` and ``2 pp - 1 - r`` under ZBV (the V
    placement torch's ``ScheduleZBVZeroBubble`` expects). The first stage keeps the embeddings, the last
    the final norm and head.
    """
    if model.spec.tie_embeddings:
        raise TrialError("tied embeddings cannot be split over pipeline stages in trials; use PP=1")
    num_stages = plan.pp * plan.virtual_stages
    sizes = split_layers(model.spec.num_layers, plan).chunk_layers  # uneven as torchtitan cuts it
    starts = [sum(sizes[:i]) for i in range(num_stages)]
    if plan.schedule.v_shape:
        stage_ids = [pp_rank, num_stages - 1 - pp_rank]
    else:
        stage_ids = [pp_rank + v * plan.pp for v in range(plan.virtual_stages)]
    chunks = []
    for i, stage in enumerate(stage_ids):
        chunk = model if i == len(stage_ids) - 1 else copy.deepcopy(model)
        keep = {str(n) for n in range(starts[stage], starts[stage] + sizes[stage])}
        for key in [k for k in chunk.layers if k not in keep]:
            del chunk.layers[key]
        if stage != 0:
            chunk.embed_tokens = chunk.embed_positions = None
        if stage != num_stages - 1:
            chunk.norm = chunk.lm_head = None
        chunks.append((stage, chunk))
    return chunks


def build_schedule(
    chunks: list[tuple[int, nn.Module]],
    *,
    plan: ParallelPlan,
    mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
):
    """A ``torch.distributed.pipelining`` schedule over this rank's chunks; the loss is a per-micro-batch
    mean and the schedule divides gradients by the number of micro-batches (``scale_grads``)."""
    from torch.distributed import pipelining as pipe

    group = mesh["pp"].get_group()
    num_stages = plan.pp * plan.virtual_stages
    stages = [pipe.PipelineStage(m, idx, num_stages, device, group=group) for idx, m in chunks]
    cls = getattr(pipe, plan.schedule.torch_class)
    multi = plan.schedule.looped or plan.schedule.v_shape  # a list of this rank's stages
    return cls(stages if multi else stages[0], n_microbatches=plan.num_microbatches, loss_fn=loss_fn)
