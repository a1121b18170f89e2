"""ParallelPlan: one frozen type that owns every degree and divisibility invariant.

Rank grid (outermost -> innermost): ``pp, dp, cp, tp``. Consecutive global ranks differ first in TP, so a
TP group of size <= gpus_per_node stays inside one node (NVLink); CP groups come next, then DP, and PP
stages are spread furthest apart (they only exchange point-to-point activations). This is Megatron's
default order (``tp-cp-ep-dp-pp``) and torchtitan's ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``.
With HSDP the DP axis splits into ``dp_replicate`` (outer) x ``dp_shard`` (inner).

``check_plan`` returns the reasons a plan is illegal for a model and cluster (a value, for the search);
``ParallelPlan(...)`` raises ``ConfigError`` only for rules that need nothing but the plan itself. The rules
live in ``autotune.legality``, the knob enums in ``autotune.planenums``; both are re-exported here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from autotune.errors import ConfigError
from autotune.legality import check_plan, expert_errors, plan_errors
from autotune.pickled import by_values
from autotune.planenums import (
    FP8_RECIPES,
    FRAMEWORK_SHARDING,
    MESH_ORDER,
    MOE_DISPATCHERS,
    OFFLOAD_MODULES,
    RECOMPUTE_MODULES,
    CpComm,
    Fp8Recipe,
    Framework,
    GradDtype,
    LossKernel,
    MeshAxis,
    MoeDispatcher,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    StoreDtype,
    zero_stage,
)

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
    "ParallelPlan",
    "MESH_ORDER",
    "FRAMEWORK_SHARDING",
    "plan_errors",
    "check_plan",
    "expert_errors",
    "FP8_RECIPES",
    "MOE_DISPATCHERS",
    "RECOMPUTE_MODULES",
    "OFFLOAD_MODULES",
]


@by_values
@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """How one training step is laid out over ``tp * pp * dp * cp`` GPUs."""

    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split of every block)."""
    pp: int = 1
    """Pipeline-parallel degree (stages)."""
    dp: int = 1
    """Data-parallel degree (replicas, or the sharding group for ZeRO/FSDP)."""
    cp: int = 1
    """Context-parallel degree (ring attention over the sequence)."""
    micro_batch: int = 1
    """Sequences per micro-batch per DP rank."""
    global_batch: int
    """Sequences per optimizer step over all replicas: the user's, never changed by the tuner."""
    seq_len: int
    """Tokens per sequence."""
    sharding: Sharding = Sharding.NONE
    hsdp_shard_size: int | None = None
    """With ``sharding=hsdp``: ranks per shard group (divides dp); replicas = dp / hsdp_shard_size."""
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms/dropout split over the TP group (needs tp > 1)."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedule)."""
    offload: bool = False
    """Optimizer states (and the fp32 master copy) live in host memory; the step runs on the CPU."""
    precision: Precision = Precision.BF16
    framework: Framework = Framework.FSDP
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
    """fp8 scaling recipe (read only with ``precision=fp8``)."""
    compile: bool = False
    """torch.compile the model (fsdp framework): fuses norms, RoPE, SwiGLU and fp8 casts
    (``costmodel.compute.eager_extra_bytes_per_token``); needed by async TP."""
    async_tp: bool = False
    """torch async tensor parallelism (micro-pipelined all-gather/reduce-scatter matmuls; torchtitan
    ``enable_async_tensor_parallel``): TP collectives hide behind the GEMMs they feed (fsdp framework)."""
    tp_comm_overlap: bool = False
    """Megatron/TE ``--tp-comm-overlap`` (userbuffers): TP all-gathers/reduce-scatters overlap the GEMMs in
    forward and backward (needs sequence parallelism)."""
    overlap_grad_reduce: bool = True
    """DP gradient reduction overlaps the backward (Megatron ``--overlap-grad-reduce``; FSDP2 and DeepSpeed
    always do)."""
    overlap_param_gather: bool = True
    """ZeRO-1 parameter all-gather overlaps the next forward (Megatron ``--overlap-param-gather``)."""
    cp_comm: CpComm = CpComm.P2P
    """Context-parallel K/V exchange (read only with ``cp > 1``)."""
    ep: int = 1
    """Expert-parallel degree: the routed experts of each MoE layer are split over ``ep`` ranks that exchange
    tokens all-to-all. It folds into the dense layout (``tp x dp x cp`` ranks of a stage), not a new axis:
    Megatron-Core's MoE parallel folding, torchtitan's ``ep`` borrowed from ``dp_shard x cp (x tp)``."""
    etp: int = 1
    """Expert tensor-parallel degree: each expert's matrices split over ``etp`` ranks (Megatron
    ``--expert-tensor-parallel-size``, torchtitan ``expert_tensor_parallel_degree``)."""
    recompute_layers: int | None = None
    """With ``recompute=full`` on Megatron: blocks of each model chunk recomputed (the first ones,
    ``--recompute-method block --recompute-num-layers``); the rest keep their activations. None: all."""
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    """MoE token dispatch (read only with ``ep > 1``): Megatron's ``--moe-token-dispatcher-type alltoall``;
    ``allgather`` (every rank gathers the EP group's tokens and keeps its experts', the outputs
    reduce-scattered back); or ``flex`` with ``--moe-flex-dispatcher-backend deepep | hybridep``, which send a
    token once per destination node across nodes and forward it over NVLink there. torchtitan (framework fsdp)
    runs ``alltoall`` (its ``"standard"`` backend) or ``deepep`` (``expert_parallel_comm_backend``, since
    v0.2.1)."""
    recompute_modules: tuple[str, ...] = ()
    """With ``recompute=selective`` on Megatron: ``--recompute-modules`` (``RECOMPUTE_MODULES``); empty:
    Megatron's default ``core_attn``, the attention core (``costmodel.recompute_modules``)."""
    offload_activation_layers: int = 0
    """Megatron ``--cpu-offloading-num-layers N``: Transformer Engine's CPU offload context moves the stored
    activations of N transformer layers to host memory in forward and brings them back for backward
    (``costmodel.activations.offloaded_layers``). 0: none."""
    offload_modules: tuple[str, ...] = ()
    """Megatron ``--fine-grained-activation-offloading --offload-modules`` (``OFFLOAD_MODULES``): the inputs
    the listed modules save for backward go to host memory in forward and come back before their backward
    (``costmodel.actoffload``). Empty: none."""
    precision_aware_optimizer: bool = False
    """Megatron ``--use-precision-aware-optimizer`` (TE ``FusedAdam``): with bf16 parameters the fp32 master
    copy keeps only its low 16 bits (``store_param_remainders``, on by default), 10 B of optimizer state
    per parameter instead of 12 (``costmodel.states``)."""
    grad_reduce_dtype: GradDtype | None = None
    """Megatron's gradient buffer and DP reduction dtype (``--grad-reduce-in-bf16`` for bf16). None: the
    framework default as autotune emits it, fp32 except bf16 for fp8 plans (``costmodel.states``)."""
    weight_dtype: StoreDtype = StoreDtype.FP32
    """Framework fsdp: the stored (sharded) parameters, hence FSDP2's sharded gradients. fp32: mixed precision
    over fp32 masters (torchtitan, the trials); bf16: the model built in bf16 with no master copy (NeMo
    AutoModel's benchmark recipes). The user's numerics, never tuned (``costmodel.states``)."""
    adam_dtype: StoreDtype | None = None
    """Framework fsdp: Adam's two moments. None: the weights' dtype, as ``torch.optim.Adam(W)`` allocates
    them (``zeros_like(param)``); fp32 with bf16 weights is Transformer Engine's ``FusedAdam`` default."""
    loss_kernel: LossKernel = LossKernel.FP32
    """Framework fsdp: the cross-entropy the train script runs. fp32: eager on logits upcast first
    (torchtitan's ``pred.float()``); bf16: eager on the bf16 logits (AutoModel's ``MaskedCrossEntropy(
    fp32_upcast=False)``); fused: one kernel that keeps the bf16 logits and writes their gradient once
    (flash-attn's ``CrossEntropyLoss``, llm-foundry's default ``fused_crossentropy``); chunked: the head and
    loss by token chunks, no logits kept (Liger's ``LigerFusedLinearCrossEntropyLoss``; TP 1)."""
    moe_capacity_factor: float | None = None
    """MoE token dropping: each expert takes at most ``ceil(c x T x k / E)`` of the ``T x k`` token copies a
    rank routes (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021 Sec. 2.2), the lowest
    routing probabilities dropped, and every expert's input padded to that capacity: Megatron's
    ``--moe-expert-capacity-factor c --moe-pad-expert-input-to-capacity`` (which skips the dropless
    dispatcher's host sync), DeepSpeed-MoE's ``capacity_factor`` with ``drop_tokens=True``. None: dropless.
    Dropping changes what the model learns, so the search never picks it: the user sets it."""
    moe_a2a_overlap: bool = False
    """Megatron's ``--overlap-moe-expert-parallel-comm --delay-wgrad-compute``: in the steady state of the
    schedule one micro-batch's forward and another's backward run layer by layer together, each one's
    token all-to-alls on a side stream under the other's compute (``costmodel.epoverlap``). Megatron only,
    EP > 1."""
    moe_load_imbalance: float = 1.0
    """Routed token copies the busiest EP rank receives over the mean (>= 1). Dropless routing lets expert
    loads differ and every rank waits for the busiest at the combine, so its expert GEMMs, exchange and
    buffers set the time and the peak. 1.0: balanced, as framework benchmarks force it (Megatron
    ``--moe-router-force-load-balancing``); a trained router with an auxiliary loss runs above (measure yours:
    Megatron logs tokens per expert with ``--moe-per-layer-logging``). With ``moe_capacity_factor`` the padded
    capacity sets the load instead. A property of the user's routing, never tuned."""

    def __post_init__(self) -> None:
        for name, enum in _ENUM_FIELDS.items():  # accept plain strings, store enum members
            value = getattr(self, name)
            if not isinstance(value, enum) and not (value is None and name in _OPTIONAL_ENUMS):
                object.__setattr__(self, name, _coerce(name, value, "plan"))
        errors = plan_errors(self)
        if errors:
            raise ConfigError(errors[0])

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def megatron_grad_dtype(self) -> GradDtype:
        """Megatron's gradient-buffer dtype: ``grad_reduce_dtype``, else bf16 for fp8 plans (NeMo's fp8
        recipes) and fp32 otherwise (``costmodel.states.megatron_grad_bytes``)."""
        if self.grad_reduce_dtype is not None:
            return self.grad_reduce_dtype
        return GradDtype.BF16 if self.precision is Precision.FP8 else GradDtype.FP32

    @property
    def numerics_flags(self) -> list[str]:
        """The stored dtypes and loss kernel set away from fp32 (``--weight-dtype bf16`` ...), as flags."""
        fields = (("weight-dtype", self.weight_dtype), ("adam-dtype", self.adam_dtype))
        flags = [f"--{flag} {value}" for flag, value in fields if value is StoreDtype.BF16]
        return flags + (
            [f"--loss-kernel {self.loss_kernel}"] if self.loss_kernel is not LossKernel.FP32 else []
        )

    @property
    def moment_dtype(self) -> StoreDtype:
        """Adam's moments: ``adam_dtype``, else the weights' dtype."""
        return self.adam_dtype if self.adam_dtype is not None else self.weight_dtype

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per pipeline = gradient accumulation steps."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def grad_accum(self) -> int:
        return self.num_microbatches

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def shard_degree(self) -> int:
        """Ranks over which sharded states are split: dp, or the HSDP shard-group size."""
        return self.hsdp_shard_size if self.sharding is Sharding.HSDP and self.hsdp_shard_size else self.dp

    @property
    def expert_shard_degree(self) -> int:
        """Ranks a routed expert's states are sharded and reduced over: the stage's sharded ranks re-tiled as
        ``etp x ep x group``, ``shard x cp x tp / (ep x etp)``: Megatron's expert-data-parallel group
        (``parallel_state.initialize_model_parallel``, world / (pp x etp x ep)), torchtitan's ``efsdp``
        mesh (``parallel_dims.py``; under HSDP the ``dp_replicate`` copies are not sharded, as dense states
        are not)."""
        return max(1, self.shard_degree * self.cp * self.tp // (self.ep * self.etp))

    @property
    def zero_stage(self) -> int:
        """0-3 in ZeRO terms: what is sharded (optimizer=1, +grads=2, +params=3)."""
        return zero_stage(self.sharding)

    @property
    def params_sharded(self) -> bool:
        return self.zero_stage == 3

    def replace(self, **changes: Any) -> ParallelPlan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Enum) else v)
            for f in dataclasses.fields(self)
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "plan") -> ParallelPlan:
        """Parse a plan (e.g. ``plan.json``); unknown keys and bad values are ``ConfigError``."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping of plan fields")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(f"{where}: unknown plan field '{unknown[0]}'; allowed: {', '.join(names)}")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            kwargs[key] = _coerce(key, value, where)
        for required in ("global_batch", "seq_len"):
            if required not in kwargs:
                raise ConfigError(f"{where}: missing plan field '{required}'")
        return cls(**kwargs)


_ENUM_FIELDS: dict[str, type[Enum]] = {
    "sharding": Sharding,
    "recompute": Recompute,
    "schedule": Schedule,
    "precision": Precision,
    "framework": Framework,
    "fp8_recipe": Fp8Recipe,
    "cp_comm": CpComm,
    "moe_dispatcher": MoeDispatcher,
    "grad_reduce_dtype": GradDtype,
    "weight_dtype": StoreDtype,
    "adam_dtype": StoreDtype,
    "loss_kernel": LossKernel,
}
_OPTIONAL_ENUMS = {"grad_reduce_dtype", "adam_dtype"}
_BOOL_FIELDS = {
    "sequence_parallel",
    "offload",
    "compile",
    "async_tp",
    "tp_comm_overlap",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "precision_aware_optimizer",
    "moe_a2a_overlap",
}


def _coerce(key: str, value: Any, where: str) -> Any:
    if key in _OPTIONAL_ENUMS and value is None:
        return None
    if key in _ENUM_FIELDS:
        enum = _ENUM_FIELDS[key]
        try:
            return enum(value)
        except ValueError:
            allowed = ", ".join(e.value for e in enum)  # type: ignore[attr-defined]
            raise ConfigError(f"{where}: {key} must be one of {allowed}, got {value!r}") from None
    if key in _BOOL_FIELDS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
        return value
    if key in ("recompute_modules", "offload_modules"):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {key} must be a list of module names, got {value!r}")
        return tuple(value)
    if key in ("hsdp_shard_size", "recompute_layers", "moe_capacity_factor") and value is None:
        return None
    if key == "moe_load_imbalance":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: moe_load_imbalance must be a number >= 1 (1.0), got {value!r}")
        return float(value)
    if key == "moe_capacity_factor":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: moe_capacity_factor must be a number (1.0) or null, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value
