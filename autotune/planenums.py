"""The plan's knobs as enums, and the tables of what each framework offers (shardings, fp8 recipes).

``autotune.plan`` re-exports every name here; the rules that read these tables are in ``autotune.legality``.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "MeshAxis",
    "Sharding",
    "Recompute",
    "Schedule",
    "Precision",
    "Framework",
    "Fp8Recipe",
    "CpComm",
    "MoeDispatcher",
    "GradDtype",
    "StoreDtype",
    "LossKernel",
    "MESH_ORDER",
    "FRAMEWORK_SHARDING",
    "FP8_RECIPES",
    "MOE_DISPATCHERS",
    "RECOMPUTE_MODULES",
    "OFFLOAD_MODULES",
    "MEGATRON_OFFLOAD_MODULES",
    "plain",
    "zero_stage",
]


class _StrEnum(str, Enum):
    def __str__(self) -> str:
        return self.value


class MeshAxis(_StrEnum):
    PP = "pp"
    DP = "dp"
    CP = "cp"
    TP = "tp"


MESH_ORDER: tuple[MeshAxis, ...] = (MeshAxis.PP, MeshAxis.DP, MeshAxis.CP, MeshAxis.TP)
"""Outermost to innermost; see the module docstring."""


class Sharding(_StrEnum):
    NONE = "none"  # DDP / ZeRO-0 / FSDP NO_SHARD: everything replicated over DP
    ZERO1 = "zero1"  # optimizer states sharded (Megatron distributed optimizer)
    ZERO2 = "zero2"  # + gradients
    ZERO3 = "zero3"  # + parameters
    FSDP_FULL = "fsdp-full"  # FSDP FULL_SHARD: like ZeRO-3, reshard after forward
    FSDP_GRAD_OP = "fsdp-grad-op"  # FSDP SHARD_GRAD_OP: params kept gathered between forward and backward
    HSDP = "hsdp"  # FULL_SHARD inside groups of hsdp_shard_size, replicated across groups


class Recompute(_StrEnum):
    NONE = "none"
    SELECTIVE = "selective"  # Korthikanti et al. 2022 Sec. 4.2: recompute the attention core only
    FULL = "full"  # recompute each transformer block in backward


class Schedule(_StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"  # Narayanan et al. 2021 Sec. 2.2.2, needs virtual_stages >= 2
    INTERLEAVED_ZB = "interleaved-zb"  # torch's ScheduleInterleavedZeroBubble (Qi et al. 2024 ZB1P)
    ZBV = "zbv"  # torch's ScheduleZBVZeroBubble (Qi et al. 2024 Sec. 6 ZB-V): two chunks per rank in a V

    @property
    def looped(self) -> bool:
        """``v >= 2`` model chunks per rank, chunk ``c`` on rank ``c % pp`` (both interleaved schedules)."""
        return self in (Schedule.INTERLEAVED, Schedule.INTERLEAVED_ZB)

    @property
    def zero_bubble(self) -> bool:
        """The backward split into input and weight gradients, the weight half deferred into the bubble
        (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241)."""
        return self in (Schedule.INTERLEAVED_ZB, Schedule.ZBV)

    @property
    def v_shape(self) -> bool:
        """Two chunks per rank placed in a V: rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``, so rank 0
        holds the embedding and the head (torch's ``generate_stage_to_rank_mapping(style="v")``)."""
        return self is Schedule.ZBV

    @property
    def torch_name(self) -> str:
        """The name torch's ``get_schedule_class`` takes for it, which torchtitan's
        ``pipeline_parallel_schedule`` is."""
        return _TORCH_NAMES[self]

    @property
    def torch_class(self) -> str:
        """The ``torch.distributed.pipelining`` schedule class that runs it (the trials' and torchtitan's)."""
        return f"Schedule{self.torch_name}"


_TORCH_NAMES = {
    Schedule.GPIPE: "GPipe",
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED: "Interleaved1F1B",
    Schedule.INTERLEAVED_ZB: "InterleavedZeroBubble",
    Schedule.ZBV: "ZBVZeroBubble",
}


class Precision(_StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Framework(_StrEnum):
    FSDP = "fsdp"  # torchrun + FSDP2 / DTensor TP / torch.distributed.pipelining
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"


class Fp8Recipe(_StrEnum):
    """How fp8 GEMM operands are scaled (``costmodel.kernels.FP8_CAST_BYTES`` prices each)."""

    TENSORWISE = "tensorwise"  # one scale per tensor from its current amax (TE current scaling)
    DELAYED = "delayed"  # one scale per tensor from an amax history (TE DelayedScaling)
    ROWWISE = "rowwise"  # one scale per row (torchao rowwise)
    BLOCKWISE = "blockwise"  # 1x128 / 128x128 tiles (TE Float8BlockScaling, DeepSeek-V3)
    MX = "mx"  # MXFP8, 32-element blocks (Blackwell)


class MoeDispatcher(_StrEnum):
    """How MoE tokens reach their experts' ranks (``costmodel.moe.all_to_all_s`` prices each)."""

    ALLTOALL = "alltoall"  # NCCL all-to-all, one copy per routed expert (Megatron alltoall)
    DEEPEP = "deepep"  # Megatron flex + DeepEP: one copy per destination node over the NICs
    HYBRIDEP = "hybridep"  # Megatron flex + HybridEP (a DeepEP-V1 branch): the same forwarding
    ALLGATHER = "allgather"  # Megatron allgather: the EP group's tokens gathered, outputs reduce-scattered


class CpComm(_StrEnum):
    """How context parallelism exchanges keys and values (``costmodel.cpcomm`` prices each)."""

    P2P = "p2p"  # ring, overlapped step by step (Megatron p2p, torchtitan alltoall)
    ALLGATHER = "allgather"  # all K/V gathered at once (Megatron allgather, torchtitan allgather)
    A2A = "a2a"  # DeepSpeed-Ulysses head/sequence all-to-all (Megatron a2a)


class GradDtype(_StrEnum):
    """Element type of Megatron's gradient buffer, which its DP reduction sends (``costmodel.states``)."""

    FP32 = "fp32"  # --accumulate-allreduce-grads-in-fp32 (Megatron's default under --bf16)
    BF16 = "bf16"  # --grad-reduce-in-bf16 (DDP grad_reduce_in_fp32=False)


class StoreDtype(_StrEnum):
    """Element type a framework fsdp plan keeps its weights, Adam moments or loss in (``costmodel.states``,
    ``costmodel.lossmemory``): a numerics choice of the user's, which changes convergence, never tuned."""

    FP32 = "fp32"  # fp32 master weights / moments / logits upcast (torchtitan, the trials)
    BF16 = "bf16"  # stored in bf16 (NeMo AutoModel's benchmark recipes: a bf16 model, torch.optim.Adam)


class LossKernel(_StrEnum):
    """The cross-entropy a plan runs (``costmodel.activations`` / ``lossmemory`` price its memory,
    ``costmodel.compute`` / ``lossbytes`` its traffic): a framework fsdp train script's, or Megatron's (fp32:
    its vocab-parallel fp32 cross-entropy; fused: Transformer Engine's); the user's choice, never tuned."""

    FP32 = "fp32"  # eager on fp32-upcast logits (torchtitan, transformers' loss; Megatron's default)
    BF16 = "bf16"  # eager on the bf16 logits (NeMo AutoModel's MaskedCrossEntropy(fp32_upcast=False))
    FUSED = "fused"  # one kernel keeping the bf16 logits (flash-attn's, llm-foundry's; Megatron: TE's)
    CHUNKED = "chunked"  # head GEMM + loss by token chunks, logits never whole (Liger's fused linear CE)


FRAMEWORK_SHARDING: dict[Framework, frozenset[Sharding]] = {
    Framework.FSDP: frozenset({Sharding.NONE, Sharding.FSDP_FULL, Sharding.FSDP_GRAD_OP, Sharding.HSDP}),
    Framework.DEEPSPEED: frozenset({Sharding.NONE, Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3}),
    Framework.MEGATRON: frozenset({Sharding.NONE, Sharding.ZERO1, Sharding.FSDP_FULL}),
}
"""Megatron's fsdp-full is Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params``, megatron/core/distributed/fsdp/), which Megatron-Bridge's recent performance recipes
run for Llama 3 8B/70B/405B (scripts/performance/configs/llama: ``use_megatron_fsdp``)."""


_ZERO_STAGE = {
    Sharding.NONE: 0,
    Sharding.ZERO1: 1,
    Sharding.ZERO2: 2,
    Sharding.ZERO3: 3,
    Sharding.FSDP_FULL: 3,
    Sharding.FSDP_GRAD_OP: 2,
    Sharding.HSDP: 3,
}


def zero_stage(sharding: Sharding) -> int:
    """0-3 in ZeRO terms: what is sharded (optimizer=1, +grads=2, +params=3)."""
    return _ZERO_STAGE[sharding]


FP8_RECIPES: dict[Framework, frozenset[Fp8Recipe]] = {
    Framework.MEGATRON: frozenset(
        {Fp8Recipe.TENSORWISE, Fp8Recipe.DELAYED, Fp8Recipe.BLOCKWISE, Fp8Recipe.MX}
    ),
    Framework.FSDP: frozenset({Fp8Recipe.TENSORWISE, Fp8Recipe.ROWWISE, Fp8Recipe.MX}),
    Framework.DEEPSPEED: frozenset(),
}
"""fp8 recipes each framework runs: Megatron ``--fp8-recipe {tensorwise,delayed,blockwise,mxfp8}``
(megatron/training/arguments.py); torchtitan ``[quantize.linear.float8] recipe_name`` tensorwise / rowwise
and ``[quantize.linear.mx]`` (torchao); DeepSpeed none."""

MOE_DISPATCHERS: dict[Framework, frozenset[MoeDispatcher]] = {
    Framework.MEGATRON: frozenset(MoeDispatcher),
    Framework.FSDP: frozenset({MoeDispatcher.ALLTOALL, MoeDispatcher.DEEPEP}),
    Framework.DEEPSPEED: frozenset({MoeDispatcher.ALLTOALL}),
}
"""MoE token dispatchers each framework runs: Megatron's ``--moe-token-dispatcher-type`` alltoall, allgather
and flex (``--moe-flex-dispatcher-backend deepep | hybridep``); torchtitan's ``expert_parallel_comm_backend``
``"standard"`` (all-to-all) or ``"deepep"`` (v0.2.1 and later, torchtitan 36a4b6942); DeepSpeed-MoE's
all-to-all."""


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-Core's ``--recompute-modules`` (megatron/core/transformer/transformer_config.py)."""

OFFLOAD_MODULES = ("expert_fc1", "moe_act")
"""Megatron-Core's ``--offload-modules`` (fine-grained activation offloading) that autotune prices
(``costmodel.actoffload``): the routed experts' FC1 input and activation input, what MoE recipes offload."""
MEGATRON_OFFLOAD_MODULES = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
    "fused_group_mlp",
    "gdp_qkv",
)
"""Every module Megatron accepts (``TransformerConfig.__post_init__`` ``allowed_modules``); those not in
``OFFLOAD_MODULES`` are refused as not priced."""


def plain(value: object) -> object:
    """An enum member as its value, a module list as its ``+``-joined names ("none" when empty): JSON and
    Optuna take plain values."""
    if isinstance(value, tuple):
        return "+".join(value) or "none"
    return value.value if isinstance(value, Enum) else value
