"""ParallelPlan: one frozen type that owns every degree and divisibility invariant.

Rank grid (outermost -> innermost): ``pp, dp, cp, tp``. Consecutive global ranks differ first in TP, so a
TP group of size <= gpus_per_node stays inside one node (NVLink); CP groups come next, then DP, and PP
stages are spread furthest apart (they only exchange point-to-point activations). This is Megatron's
default order (``tp-cp-ep-dp-pp``) and torchtitan's ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``.
With HSDP the DP axis splits into ``dp_replicate`` (outer) x ``dp_shard`` (inner).

``check_plan`` returns the reasons a plan is illegal for a model and cluster (a value, for the search);
``ParallelPlan(...)`` raises ``ConfigError`` only for rules that need nothing but the plan itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from autotune.errors import ConfigError
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import split_error

__all__ = [
    "MeshAxis", "Sharding", "Recompute", "Schedule", "Precision", "Framework", "Fp8Recipe", "CpComm",
    "MoeDispatcher", "GradDtype", "ParallelPlan",
    "MESH_ORDER", "FRAMEWORK_SHARDING", "plan_errors", "check_plan", "expert_errors",
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
    NONE = "none"                    # DDP / ZeRO-0 / FSDP NO_SHARD: everything replicated over DP
    ZERO1 = "zero1"                  # optimizer states sharded (Megatron distributed optimizer)
    ZERO2 = "zero2"                  # + gradients
    ZERO3 = "zero3"                  # + parameters
    FSDP_FULL = "fsdp-full"          # FSDP FULL_SHARD: like ZeRO-3, reshard after forward
    FSDP_GRAD_OP = "fsdp-grad-op"    # FSDP SHARD_GRAD_OP: params kept gathered between forward and backward
    HSDP = "hsdp"                    # FULL_SHARD inside groups of hsdp_shard_size, replicated across groups


class Recompute(_StrEnum):
    NONE = "none"
    SELECTIVE = "selective"          # Korthikanti et al. 2022 Sec. 4.2: recompute the attention core only
    FULL = "full"                    # recompute each transformer block in backward


class Schedule(_StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"      # Narayanan et al. 2021 Sec. 2.2.2, needs virtual_stages >= 2


class Precision(_StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


class Framework(_StrEnum):
    FSDP = "fsdp"                    # torchrun + FSDP2 / DTensor TP / torch.distributed.pipelining
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"


class Fp8Recipe(_StrEnum):
    """How fp8 GEMM operands are scaled (``costmodel.kernels.FP8_CAST_BYTES`` prices each)."""

    TENSORWISE = "tensorwise"        # one scale per tensor from its current amax (TE current scaling)
    DELAYED = "delayed"              # one scale per tensor from an amax history (TE DelayedScaling)
    ROWWISE = "rowwise"              # one scale per row (torchao rowwise)
    BLOCKWISE = "blockwise"          # 1x128 / 128x128 tiles (TE Float8BlockScaling, DeepSeek-V3)
    MX = "mx"                        # MXFP8, 32-element blocks (Blackwell)


class MoeDispatcher(_StrEnum):
    """How MoE tokens reach their experts' ranks (``costmodel.moe.all_to_all_s`` prices each)."""

    ALLTOALL = "alltoall"            # NCCL all-to-all, one copy per routed expert (Megatron alltoall)
    DEEPEP = "deepep"                # Megatron flex + DeepEP: one copy per destination node over the NICs
    HYBRIDEP = "hybridep"            # Megatron flex + HybridEP (a DeepEP-V1 branch): the same forwarding


class CpComm(_StrEnum):
    """How context parallelism exchanges keys and values (``costmodel.cpcomm`` prices each)."""

    P2P = "p2p"                      # ring, overlapped step by step (Megatron p2p, torchtitan alltoall)
    ALLGATHER = "allgather"          # all K/V gathered at once (Megatron allgather, torchtitan allgather)
    A2A = "a2a"                      # DeepSpeed-Ulysses head/sequence all-to-all (Megatron a2a)


class GradDtype(_StrEnum):
    """Element type of Megatron's gradient buffer, which its DP reduction sends (``costmodel.states``)."""

    FP32 = "fp32"                    # --accumulate-allreduce-grads-in-fp32 (Megatron's default under --bf16)
    BF16 = "bf16"                    # --grad-reduce-in-bf16 (DDP grad_reduce_in_fp32=False)


FRAMEWORK_SHARDING: dict[Framework, frozenset[Sharding]] = {
    Framework.FSDP: frozenset({Sharding.NONE, Sharding.FSDP_FULL, Sharding.FSDP_GRAD_OP, Sharding.HSDP}),
    Framework.DEEPSPEED: frozenset({Sharding.NONE, Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3}),
    Framework.MEGATRON: frozenset({Sharding.NONE, Sharding.ZERO1, Sharding.FSDP_FULL}),
}
"""Megatron's fsdp-full is Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy
optim_grads_params``, megatron/core/distributed/fsdp/), which Megatron-Bridge's recent performance recipes
run for Llama 3 8B/70B/405B (scripts/performance/configs/llama: ``use_megatron_fsdp``)."""


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
    """MoE token dispatch (read only with ``ep > 1``): Megatron's ``--moe-token-dispatcher-type alltoall``,
    or ``flex`` with ``--moe-flex-dispatcher-backend deepep | hybridep``, which send a token once per
    destination node across nodes and forward it over NVLink there."""
    recompute_modules: tuple[str, ...] = ()
    """With ``recompute=selective`` on Megatron: ``--recompute-modules`` (``RECOMPUTE_MODULES``); empty:
    Megatron's default ``core_attn``, the attention core (``costmodel.recompute_modules``)."""
    offload_activation_layers: int = 0
    """Megatron ``--cpu-offloading-num-layers N``: Transformer Engine's CPU offload context moves the stored
    activations of N transformer layers to host memory in forward and brings them back for backward
    (``costmodel.activations.offloaded_layers``). 0: none."""
    precision_aware_optimizer: bool = False
    """Megatron ``--use-precision-aware-optimizer`` (TE ``FusedAdam``): with bf16 parameters the fp32 master
    copy keeps only its low 16 bits (``store_param_remainders``, on by default), 10 B of optimizer state
    per parameter instead of 12 (``costmodel.states``)."""
    grad_reduce_dtype: GradDtype | None = None
    """Megatron's gradient buffer and DP reduction dtype (``--grad-reduce-in-bf16`` for bf16). None: the
    framework default as autotune emits it, fp32 except bf16 for fp8 plans (``costmodel.states``)."""

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
    def expert_dp(self) -> int:
        """Ranks that hold the same experts of a stage (Megatron's expert-data-parallel group,
        ``megatron/core/parallel_state.py`` ``initialize_model_parallel``: world / (pp x etp x ep))."""
        return max(1, self.tp * self.dp * self.cp // (self.ep * self.etp))

    @property
    def megatron_grad_dtype(self) -> GradDtype:
        """Megatron's gradient-buffer dtype: ``grad_reduce_dtype``, else bf16 for fp8 plans (NeMo's fp8
        recipes) and fp32 otherwise (``costmodel.states.megatron_grad_bytes``)."""
        if self.grad_reduce_dtype is not None:
            return self.grad_reduce_dtype
        return GradDtype.BF16 if self.precision is Precision.FP8 else GradDtype.FP32

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
    def zero_stage(self) -> int:
        """0-3 in ZeRO terms: what is sharded (optimizer=1, +grads=2, +params=3)."""
        return {Sharding.NONE: 0, Sharding.ZERO1: 1, Sharding.ZERO2: 2, Sharding.ZERO3: 3,
                Sharding.FSDP_FULL: 3, Sharding.FSDP_GRAD_OP: 2, Sharding.HSDP: 3}[self.sharding]

    @property
    def params_sharded(self) -> bool:
        return self.zero_stage == 3

    def replace(self, **changes: Any) -> ParallelPlan:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Enum) else v)
                for f in dataclasses.fields(self)}

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
    "sharding": Sharding, "recompute": Recompute, "schedule": Schedule, "precision": Precision,
    "framework": Framework, "fp8_recipe": Fp8Recipe, "cp_comm": CpComm, "moe_dispatcher": MoeDispatcher,
    "grad_reduce_dtype": GradDtype,
}
_OPTIONAL_ENUMS = {"grad_reduce_dtype"}
_BOOL_FIELDS = {"sequence_parallel", "offload", "compile", "async_tp", "tp_comm_overlap",
                "overlap_grad_reduce", "overlap_param_gather", "precision_aware_optimizer"}


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
    if key == "recompute_modules":
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: recompute_modules must be a list of module names, got {value!r}")
        return tuple(value)
    if key in ("hsdp_shard_size", "recompute_layers") and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def plan_errors(plan: ParallelPlan) -> list[str]:
    """Rules that need only the plan. Each message names the flag and what would satisfy it."""
    for name in ("tp", "pp", "dp", "cp", "micro_batch", "global_batch", "seq_len", "virtual_stages", "ep",
                 "etp"):
        value = getattr(plan, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return [f"{name.replace('_', '-')} must be a positive integer, got {value!r}"]
    errors: list[str] = []
    if plan.recompute_layers is not None:
        errors += _recompute_layers_errors(plan)
    if plan.recompute_modules:
        errors += _recompute_modules_errors(plan)
    errors += _megatron_memory_option_errors(plan)
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        errors.append(f"global batch {plan.global_batch} is not divisible by DP x micro-batch = "
                      f"{plan.dp} x {plan.micro_batch} = {per_step}")
    errors += _sharding_errors(plan) + _pipeline_errors(plan) + _framework_errors(plan) + expert_errors(plan)
    if plan.sequence_parallel and plan.tp == 1:
        errors.append("sequence parallel needs TP > 1 (it splits norms/dropout over the TP group)")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        errors.append(f"seq-len {plan.seq_len} is not divisible by 2 x CP = {2 * plan.cp} "
                      "(load-balanced ring attention splits each sequence into 2*CP chunks)")
    return errors


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""Megatron-Core's ``--recompute-modules`` (megatron/core/transformer/transformer_config.py)."""


def _recompute_modules_errors(plan: ParallelPlan) -> list[str]:
    bad = [m for m in plan.recompute_modules if m not in RECOMPUTE_MODULES]
    if bad:
        return [f"recompute-modules: unknown module {bad[0]!r}; allowed: {', '.join(RECOMPUTE_MODULES)}"]
    if plan.recompute is not Recompute.SELECTIVE or plan.framework is not Framework.MEGATRON:
        return ["recompute-modules needs --recompute selective and --framework megatron "
                "(Megatron's --recompute-granularity selective --recompute-modules)"]
    return []
def _megatron_memory_option_errors(plan: ParallelPlan) -> list[str]:
    """Activation offload and the precision-aware optimizer are Megatron options; Megatron's
    ``TransformerConfig.__post_init__`` rejects CPU offloading with pipeline parallelism."""
    n = plan.offload_activation_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        return [f"offload-activation-layers must be a non-negative integer, got {n!r}"]
    errors = []
    if n and (plan.framework is not Framework.MEGATRON or plan.pp > 1):
        errors.append("offload-activation-layers needs --framework megatron and --pp 1 (Megatron's "
                      "--cpu-offloading-num-layers does not support pipeline parallelism)")
    distributed = plan.sharding in (Sharding.ZERO1, Sharding.FSDP_FULL) or plan.dp * plan.cp == 1
    if plan.precision_aware_optimizer and (plan.framework is not Framework.MEGATRON or not distributed):
        errors.append("precision-aware-optimizer needs --framework megatron and its distributed optimizer "
                      "(--sharding zero1 or fsdp-full, or DP x CP = 1): Megatron's "
                      "--use-precision-aware-optimizer")
    if plan.grad_reduce_dtype is not None and plan.framework is not Framework.MEGATRON:
        errors.append("grad-reduce-dtype needs --framework megatron (Megatron's --grad-reduce-in-bf16); "
                      "FSDP2 reduces in fp32 and DeepSpeed in the 16-bit model dtype")
    return errors


def _recompute_layers_errors(plan: ParallelPlan) -> list[str]:
    n = plan.recompute_layers
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return [f"recompute-layers must be a positive integer, got {n!r}"]
    if plan.recompute is not Recompute.FULL or plan.framework is not Framework.MEGATRON:
        return ["recompute-layers needs --recompute full and --framework megatron "
                "(Megatron's --recompute-num-layers with --recompute-method block)"]
    return []


def _sharding_errors(plan: ParallelPlan) -> list[str]:
    errors: list[str] = []
    if plan.sharding is Sharding.HSDP:
        s = plan.hsdp_shard_size
        if s is None or s <= 1 or s >= plan.dp or plan.dp % s:
            errors.append(f"hsdp needs a shard-group size that divides DP={plan.dp} strictly between 1 "
                          f"and DP, got {s}")
    elif plan.hsdp_shard_size is not None:
        errors.append("hsdp-shard-size is only meaningful with --sharding hsdp")
    # Megatron's distributed optimizer shards over DP x CP (megatron/core/optimizer/__init__.py:
    # ``intra_dp_cp_group``), so CP > 1 gives it ranks to shard over at DP = 1
    over = plan.dp * (plan.cp if plan.framework is Framework.MEGATRON else 1)
    if plan.sharding is not Sharding.NONE and over == 1:
        errors.append(f"sharding {plan.sharding} needs DP > 1 (with DP=1 there is nothing to shard over)")
    if plan.offload and plan.sharding is Sharding.NONE:
        errors.append("optimizer offload needs a sharded optimizer (zero1-3 or an FSDP mode)")
    return errors


def _pipeline_errors(plan: ParallelPlan) -> list[str]:
    errors: list[str] = []
    if plan.schedule is Schedule.INTERLEAVED:
        if plan.pp == 1 or plan.virtual_stages < 2:
            errors.append("the interleaved schedule needs PP > 1 and virtual stages >= 2")
    elif plan.virtual_stages != 1:
        errors.append(f"virtual stages {plan.virtual_stages} need --schedule interleaved")
    if plan.pp > 1 and plan.global_batch % (plan.dp * plan.micro_batch) == 0:
        m = plan.num_microbatches
        if plan.schedule is not Schedule.GPIPE and m < plan.pp:
            errors.append(f"{plan.schedule} needs micro-batches per step >= PP: {m} < {plan.pp} "
                          "(raise the global batch or lower the micro-batch)")
        if plan.schedule is Schedule.INTERLEAVED and m % plan.pp:
            errors.append(f"interleaved needs micro-batches per step ({m}) divisible by PP ({plan.pp})")
    return errors


def _framework_errors(plan: ParallelPlan) -> list[str]:
    fw = plan.framework
    errors: list[str] = []
    if plan.sharding not in FRAMEWORK_SHARDING[fw]:
        allowed = ", ".join(sorted(s.value for s in FRAMEWORK_SHARDING[fw]))
        errors.append(f"framework {fw} does not offer sharding {plan.sharding} (it offers: {allowed})")
    errors += _knob_errors(plan)
    if fw is Framework.MEGATRON and plan.sharding is Sharding.FSDP_FULL and (plan.pp > 1 or plan.offload):
        errors.append("Megatron-FSDP is priced without pipelining or optimizer offload (as Megatron-Bridge's "
                      "recipes run it); use --pp 1 without --offload, or --sharding zero1")
    if fw is Framework.DEEPSPEED:
        if plan.pp > 1 and plan.zero_stage > 1:
            errors.append("DeepSpeed's pipeline engine rejects ZeRO-2/3; use zero1 or none with PP > 1")
        if plan.pp > 1 and plan.tp > 1:
            errors.append("DeepSpeed pipeline + AutoTP fails in the pipeline engine; use TP=1 or PP=1")
        if plan.pp > 1 and plan.schedule is not Schedule.ONE_F_ONE_B:
            errors.append("DeepSpeed's pipeline engine runs its own 1F1B schedule only")
        if plan.cp > 1:
            errors.append("DeepSpeed has no context parallelism here; use CP=1 or --framework fsdp/megatron")
        if plan.precision is Precision.FP8:
            errors.append("DeepSpeed's engine has no fp8 training path; use bf16/fp16")
        if plan.sequence_parallel:
            errors.append("DeepSpeed AutoTP has no Megatron-style sequence parallelism; "
                          "drop --sequence-parallel")
    return errors


FP8_RECIPES: dict[Framework, frozenset[Fp8Recipe]] = {
    Framework.MEGATRON: frozenset({Fp8Recipe.TENSORWISE, Fp8Recipe.DELAYED, Fp8Recipe.BLOCKWISE,
                                   Fp8Recipe.MX}),
    Framework.FSDP: frozenset({Fp8Recipe.TENSORWISE, Fp8Recipe.ROWWISE, Fp8Recipe.MX}),
    Framework.DEEPSPEED: frozenset(),
}
"""fp8 recipes each framework runs: Megatron ``--fp8-recipe {tensorwise,delayed,blockwise,mxfp8}``
(megatron/training/arguments.py); torchtitan ``[quantize.linear.float8] recipe_name`` tensorwise / rowwise
and ``[quantize.linear.mx]`` (torchao); DeepSpeed none."""


def _knob_errors(plan: ParallelPlan) -> list[str]:
    """Speed knobs a framework does not have, or that need another setting."""
    fw, errors = plan.framework, []
    fp8 = plan.precision is Precision.FP8
    if fp8 and FP8_RECIPES[fw] and plan.fp8_recipe not in FP8_RECIPES[fw]:
        allowed = ", ".join(sorted(r.value for r in FP8_RECIPES[fw]))
        errors.append(f"framework {fw} has no fp8 recipe {plan.fp8_recipe} (it offers: {allowed})")
    if plan.compile and fw is not Framework.FSDP:
        errors.append(f"compile is a torch framework knob; framework {fw} does not torch.compile the model")
    if plan.async_tp and (fw is not Framework.FSDP or not plan.compile or plan.tp == 1):
        errors.append("async TP needs --framework fsdp (torchtitan), --compile and TP > 1")
    if plan.tp_comm_overlap and (fw is not Framework.MEGATRON or not plan.sequence_parallel):
        errors.append("tp-comm-overlap is Megatron/TE's and needs --sequence-parallel (TP > 1)")
    if plan.cp > 1 and plan.cp_comm is CpComm.A2A and fw is not Framework.MEGATRON:
        errors.append("cp-comm a2a (Ulysses) needs --framework megatron; torchtitan rotates K/V by p2p or "
                      "allgather")
    if plan.moe_dispatcher is not MoeDispatcher.ALLTOALL and fw is not Framework.MEGATRON:
        errors.append(f"moe-dispatcher {plan.moe_dispatcher} is Megatron's flex dispatcher; use --framework "
                      "megatron or moe-dispatcher alltoall")
    if fw is not Framework.MEGATRON and not (plan.overlap_grad_reduce and plan.overlap_param_gather):
        errors.append(f"framework {fw} always overlaps its DP collectives; only megatron can turn "
                      "overlap-grad-reduce / overlap-param-gather off")
    return errors


def expert_errors(plan: ParallelPlan, framework: Framework | None = None) -> list[str]:
    """Where each framework (the plan's, or ``framework``: what an emitter targets) places EP and ETP inside
    a stage's ``tp x dp x cp`` ranks."""
    ep, etp, fw = plan.ep, plan.etp, framework or plan.framework
    if ep == 1 and etp == 1:
        return []
    if fw is Framework.MEGATRON and (plan.tp * plan.dp * plan.cp) % (ep * etp):
        # megatron/core/parallel_state.py: the expert grid etp x ep x expert-dp must tile tp x cp x dp
        return [f"Megatron needs EP x ETP = {ep} x {etp} to divide TP x DP x CP = "
                f"{plan.tp * plan.dp * plan.cp} (expert parallelism folds into the dense ranks)"]
    if fw is Framework.FSDP:
        shard = plan.shard_degree if plan.sharding is not Sharding.NONE else 1
        if etp not in (1, plan.tp):  # torchtitan/distributed/parallel_dims.py _validate
            return [f"torchtitan supports ETP = 1 or ETP = TP ({plan.tp}), got {etp}"]
        borrow = shard * plan.cp * (plan.tp // etp)
        if borrow % ep:  # parallel_dims.py: efsdp = dp_shard x cp x tp / (etp x ep)
            return [f"torchtitan borrows EP from dp_shard x CP{' x TP' if etp == 1 else ''} = {borrow}; "
                    f"EP {ep} does not divide it"]
    if fw is Framework.DEEPSPEED:
        if etp > 1 or plan.tp > 1:
            return ["DeepSpeed-MoE is priced with TP = ETP = 1 here (its expert-slicing is not modelled)"]
        if plan.dp % ep:  # deepspeed/utils/groups.py _create_expert_and_data_parallel: EP divides DP
            return [f"DeepSpeed-MoE needs EP {ep} to divide DP {plan.dp}"]
        if plan.zero_stage == 3:  # deepspeed/runtime/engine.py: "MoE not supported with Stage 3"
            return ["DeepSpeed-MoE does not run with ZeRO-3; use zero1/zero2"]
    return []


def _expert_model_errors(plan: ParallelPlan, model: ModelSpec) -> list[str]:
    if not model.is_moe:
        if plan.ep > 1 or plan.etp > 1:
            return [f"EP {plan.ep} / ETP {plan.etp} on {model.name}, a dense model: expert parallelism needs "
                    "routed experts; use --ep 1"]
        return []
    errors = []
    if model.num_experts % plan.ep:
        errors.append(f"EP {plan.ep} does not divide the {model.num_experts} routed experts")
    if model.expert_ffn_hidden_size % plan.etp:
        errors.append(f"ETP {plan.etp} does not divide the expert width {model.expert_ffn_hidden_size}")
    if plan.framework is Framework.MEGATRON and plan.tp > 1 and not plan.sequence_parallel:
        # megatron/training/arguments.py: MoE with tensor parallelism requires sequence parallelism
        errors.append("Megatron MoE with TP > 1 needs --sequence-parallel")
    return errors


def check_plan(plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec) -> list[str]:
    """Rules that need the model and the cluster; [] when the plan is legal."""
    errors: list[str] = []
    if plan.world_size != cluster.num_gpus:
        errors.append(f"TP x PP x DP x CP = {plan.tp} x {plan.pp} x {plan.dp} x {plan.cp} = "
                      f"{plan.world_size} does not equal the {cluster.num_gpus} GPUs")
    if model.num_heads % plan.tp:
        errors.append(f"TP {plan.tp} does not divide attention heads {model.num_heads}")
    if model.num_kv_heads % plan.tp:
        errors.append(f"TP {plan.tp} does not divide KV heads {model.num_kv_heads}")
    if plan.cp > 1 and plan.cp_comm.value == "a2a" and model.num_heads % (plan.tp * plan.cp):
        errors.append(f"cp-comm a2a splits heads over TP x CP = {plan.tp * plan.cp}, which does not divide "
                      f"{model.num_heads} heads; use --cp-comm p2p")
    if model.ffn_hidden_size % plan.tp:
        errors.append(f"TP {plan.tp} does not divide the MLP width {model.ffn_hidden_size}")
    split = split_error(model.num_layers, plan.pp, plan.virtual_stages, str(plan.framework))
    if split:
        errors.append(split)
    if not cluster.gpu.supports(str(plan.precision)):
        errors.append(f"{cluster.gpu.key} has no {plan.precision} tensor cores")
    if "mla_up_proj" in plan.recompute_modules and not model.uses_mla:
        errors.append("recompute-modules mla_up_proj needs a model with multi-latent attention "
                      "(Megatron's transformer_config.py refuses it otherwise)")
    return errors + _expert_model_errors(plan, model)
