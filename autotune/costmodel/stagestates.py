"""Model states of each pipeline stage, which stages the memory model checks, and their floor.

A stage's blocks come from the framework's split (``autotune/stagesplit.py``); its weights, gradients and
optimizer states from ``states.py`` (which cites ZeRO and each framework), routed experts sharded over the
expert-data-parallel group (``costmodel.moe``). ``memory.py`` adds activations and buffers on top.

A search asks for the same states many times: plans that differ only in knobs the states do not read
(recompute, sequence parallelism, the overlap and kernel switches, the MoE dispatcher ...) share them, and
a large MoE space has ~20 plans per distinct states (DeepSeek-V3 on 512 H100: 2.7M plans, 116k states). So
``stage_states`` keeps them by the plan fields they can depend on: every field but ``NOT_READ``, which
``tests/costmodel/test_stage_states.py`` walks on plans of the bundled spaces.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import fields

from autotune.costmodel.inflight import in_flight_of
from autotune.costmodel.moe import expert_params_per_gpu
from autotune.costmodel.reserve import reserve_bytes
from autotune.costmodel.states import (
    MIXED_BF16,
    ModelStates,
    Numerics,
    model_state_bytes,
    stage_params_per_gpu,
)
from autotune.modelshape import mtp_block_model
from autotune.plan import ParallelPlan, Schedule
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import StageSplit, head_rank, split_layers_of

__all__ = [
    "NOT_READ",
    "rank_layers",
    "rank_moe_blocks",
    "ranks_to_check",
    "stage_states",
    "states_floor_bytes",
]

NOT_READ = frozenset(
    {
        "micro_batch",  # read as ``num_microbatches`` only (DeepSpeed's host gradient buffer), which is keyed
        "recompute",
        "recompute_layers",
        "recompute_modules",
        "sequence_parallel",
        "fp8_recipe",
        "compile",
        "async_tp",
        "tp_comm_overlap",
        "overlap_grad_reduce",
        "overlap_param_gather",
        "cp_comm",
        "moe_dispatcher",
        "moe_capacity_factor",
        "moe_a2a_overlap",
        "moe_load_imbalance",
        "offload_activation_layers",
        "offload_modules",
        "loss_kernel",
    }
)
"""Plan fields no model state reads: plans equal in every other field (and in ``num_microbatches``) have the
same states on every rank."""
_key_of = operator.attrgetter(*(f.name for f in fields(ParallelPlan) if f.name not in NOT_READ))
_MAX_KEPT = 1 << 16
"""States kept per (model, numerics) before the cache starts over: ~40 MB (~600 B each, measured with
tracemalloc on DeepSeek-V3's). Plans come layout by layout, and a layout's plans share their states, so
starting over costs little."""

StageStates = tuple[float, float, ModelStates]
_KEPT: tuple[object, object, dict[tuple[object, ...], StageStates]] = (None, None, {})
"""(model, numerics, (rank, plan key) -> ``stage_states``)."""


def stage_states(model: ModelSpec, plan: ParallelPlan, numerics: Numerics, *, rank: int) -> StageStates:
    """Blocks, parameters per GPU and model states of pipeline rank ``rank`` (kept: module docstring)."""
    global _KEPT
    kept_model, kept_numerics, kept = _KEPT
    if not (kept_model is model and kept_numerics is numerics) or len(kept) >= _MAX_KEPT:
        kept = {}
        _KEPT = (model, numerics, kept)  # one tuple, replaced whole: safe across threads
    key = (rank, plan.num_microbatches, _key_of(plan))
    found = kept.get(key)
    if found is None:
        first, last = rank == 0, rank == head_rank(plan)
        main = rank_layers(model, plan)[rank]
        moe_main = rank_moe_blocks(model, plan)
        # the last stage also holds the multi-token prediction modules (``costmodel.mtp``): a block each, or
        # a hybrid's MTP layers, whose states are those layers' (once when shared), activations a depth's each
        hybrid = mtp_block_model(model) if last else None
        layers = main + (model.mtp_layers * (1 if hybrid is None else hybrid.num_layers) if last else 0)
        blocks = layers if hybrid is None else main
        moe_blocks = None
        if moe_main is not None:  # MTP blocks are of the last layer's kind
            mtp_moe = last and hybrid is None and model.num_layers - 1 in model.moe_layers
            moe_blocks = moe_main[rank] + (model.mtp_layers if mtp_moe else 0)
        params = stage_params_per_gpu(
            model, plan, first=first, last=last, layers=blocks, moe_blocks=moe_blocks
        )
        states = _states(model, plan, params, numerics, layers=blocks, moe_blocks=moe_blocks)
        if hybrid is not None:
            n = hybrid.num_layers * (1 if model.mtp_shared else model.mtp_layers)
            extra = stage_params_per_gpu(hybrid, plan, first=False, last=False, layers=n)
            states = _add(states, _states(hybrid, plan, extra, numerics, layers=n))
            params += extra
        found = kept[key] = (layers, params, states)
    return found


def _add(a: ModelStates, b: ModelStates) -> ModelStates:
    return ModelStates(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(ModelStates)})


def _states(
    model: ModelSpec,
    plan: ParallelPlan,
    params: float,
    numerics: Numerics,
    *,
    layers: float,
    moe_blocks: float | None = None,
) -> ModelStates:
    """Model states of a stage of ``layers`` blocks (``moe_blocks`` of them MoE): routed experts sharded
    over the expert-data-parallel group (``costmodel.moe``), the rest over DP x CP."""
    experts = expert_params_per_gpu(model, plan, layers, moe_blocks)
    dense = model_state_bytes(params - experts, plan, numerics)
    if not experts:
        return dense
    return _add(dense, model_state_bytes(experts, plan, numerics, shard_degree=plan.expert_shard_degree))


def states_floor_bytes(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, *, numerics: Numerics = MIXED_BF16
) -> float:
    """A lower bound on ``memory_breakdown(...).total_bytes`` at a fraction of its cost: the model states of
    the most loaded checked stage plus the reserve, which every stage's total holds with non-negative terms
    on top. A plan whose floor is past the device cannot fit, whatever its activations: enough to answer
    "does any plan fit here?" (``rankworkers.judge``'s ``fits_only``)."""
    worst = 0.0
    for rank in ranks_to_check(model, plan):
        states = stage_states(model, plan, numerics, rank=rank)[2]
        worst = max(worst, states.weights_bytes + states.gradients_bytes + states.optimizer_bytes)
    return worst + reserve_bytes(cluster, plan)


def rank_layers(model: ModelSpec, plan: ParallelPlan) -> tuple[float, ...]:
    """Blocks of each pipeline rank as the plan's framework splits them; ``L/pp`` each where it cannot
    (an illegal plan still gets its numbers, ``check_plan`` gives the reason)."""
    return _split_rank_layers(_split_key(model, plan))


def rank_moe_blocks(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...] | None:
    """MoE blocks of each pipeline rank, counted on the block indices of its chunks (``moe_layers``): a
    rank of DeepSeek-V3's first stage holds its 3 dense blocks, the middle ranks none. None where the
    model's share holds (no PP, a dense model), or is what is priced (a hybrid pattern's mean blocks, a
    split the framework cannot make)."""
    if plan.pp == 1 or not model.is_moe or model.layer_pattern:
        return None
    return _split_rank_moe(model.moe_layers, _split_key(model, plan))


_SplitKey = tuple[int, int, int, str, int, bool]


def _split_key(model: ModelSpec, plan: ParallelPlan) -> _SplitKey:
    """What a split depends on: layers, PP, virtual stages, framework, MTP modules, V placement."""
    v_shape = plan.schedule.v_shape
    return (model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework), model.mtp_layers, v_shape)


@functools.lru_cache(maxsize=1024)
def _split(key: _SplitKey) -> StageSplit | None:
    num_layers, pp, v, framework, mtp, v_shape = key
    try:
        return split_layers_of(num_layers, pp, v, framework, mtp, v_shape=v_shape)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def _split_rank_layers(key: _SplitKey) -> tuple[float, ...]:
    split = _split(key)
    if split is None:
        num_layers, pp = key[0], key[1]
        return (num_layers / pp,) * pp
    return tuple(map(float, split.all_rank_layers()))


@functools.lru_cache(maxsize=1024)
def _split_rank_moe(moe: tuple[int, ...], key: _SplitKey) -> tuple[int, ...] | None:
    split = _split(key)
    if split is None:
        return None
    kind = frozenset(moe)
    return tuple(sum(i in kind for r in split.rank_blocks(rank) for i in r) for rank in range(split.pp))


def ranks_to_check(model: ModelSpec, plan: ParallelPlan) -> tuple[int, ...]:
    """The first and last rank, and with unequal middle ranks the one with the most blocks and the one
    with the most blocks x in-flight micro-batches (earlier ranks hold more micro-batches); with MoE blocks
    counted per rank (``rank_moe_blocks``), also the earliest middle rank with the most of them (GLM-4.5's
    3 dense blocks make its first stage lighter than the next at an even split)."""
    layers, moe = rank_layers(model, plan), rank_moe_blocks(model, plan)
    return _ranks_of(layers, plan.num_microbatches, plan.virtual_stages, plan.schedule, moe)


@functools.lru_cache(maxsize=4096)
def _ranks_of(
    layers: tuple[float, ...], m: int, v: int, schedule: Schedule, moe: tuple[int, ...] | None = None
) -> tuple[int, ...]:
    pp = len(layers)
    ranks = {0, pp - 1}
    middle = range(1, pp - 1)
    if middle and len(set(layers)) > 1:
        ranks.add(max(middle, key=lambda r: (layers[r], -r)))
        ranks.add(max(middle, key=lambda r: (layers[r] * in_flight_of(m, pp, v, schedule, r), -r)))
    if middle and moe is not None:
        ranks.add(max(middle, key=lambda r: (moe[r], -r)))
    return tuple(sorted(ranks))
