"""The search space as data: ``search_spaces/*.yaml`` -> knob choices -> legal plans and ``suggest_*`` calls.

A space file maps each plan knob to candidate values or a rule (see ``search_spaces/default.yaml``); pins from
the command line replace a knob's candidates. Two consumers share one set of rules, so they agree on legality:

* ``enumerate_plans`` yields every legal plan, grouped in ladders that differ only in micro-batch (smallest
  first: memory grows with it, so a caller can stop at the first plan that does not fit). Illegal
  combinations are never constructed; they are counted by the rule they break, first failing rule wins.
  Knobs that do not matter in a combination are collapsed, not counted (schedule when PP = 1, virtual
  stages unless interleaved, the HSDP group size unless HSDP, sequence parallel when TP = 1).
* ``suggest_plan`` turns the knobs into one ``suggest_categorical`` each, with the same choices in every
  trial (multivariate TPE needs a fixed space), and normalises the collapsed knobs the same way.

Both ask the rules of ``autotune.legality`` (the ones ``ParallelPlan`` and ``check_plan`` use) through
``autotune.spacerules``; the enumerator lives in ``autotune.enumeration`` and is re-exported here.
``tests/test_space.py`` checks the enumerator and ``check_plan`` agree by brute force.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from autotune.enumeration import Ladder, Tally, batch_blocks_every_layout, enumerate_plans, layout_dps
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM
from autotune.plan import (
    OFFLOAD_MODULES,
    CpComm,
    Fp8Recipe,
    Framework,
    GradDtype,
    LossKernel,
    MoeDispatcher,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    StoreDtype,
)
from autotune.spacerules import (
    BATCH_RULE,
    KNOBS,
    Variant,
    collapse,
    layout_rule,
    pipeline_rule,
    plain,
    telling_reasons,
    variant_rule,
)
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import pipeline_degree_ok
from autotune.userfile import read_text

__all__ = [
    "KNOBS",
    "BATCH_RULE",
    "telling_reasons",
    "Rule",
    "SearchSpace",
    "PlanContext",
    "Ladder",
    "Tally",
    "load_space",
    "resolve_choices",
    "stored_fields",
    "enumerate_plans",
    "layout_dps",
    "batch_blocks_every_layout",
    "suggest_plan",
    "plan_from_params",
    "params_of",
]

_ENUMS: dict[str, type[Enum]] = {
    "framework": Framework,
    "sharding": Sharding,
    "schedule": Schedule,
    "recompute": Recompute,
    "precision": Precision,
    "fp8_recipe": Fp8Recipe,
    "cp_comm": CpComm,
    "moe_dispatcher": MoeDispatcher,
}
_BOOLS = frozenset(
    {"offload", "sequence_parallel", "compile", "async_tp", "tp_comm_overlap", "moe_a2a_overlap"}
)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelPlan) if f.name in KNOBS}
_RULES = ("divisors_of_gpus_per_node", "divisors_of_layers", "powers_of_two", "divisors_of_experts")
_NOT_KNOBS = {
    "dp": "DP is derived: GPUs / (tp x pp x cp); pin it with --dp",
    "global_batch": "the global batch is yours, never tuned: pass --global-batch",
    "seq_len": "the sequence length is yours, never tuned: pass --seq-len",
}
_SPACES_DIR = Path(str(resources.files("autotune.search_spaces")))
"""The top-level search_spaces/ folder, shipped inside the package as ``autotune.search_spaces``."""


class Rule(NamedTuple):
    """Candidates computed from the model and cluster, bounded by ``min``/``max``."""

    name: str
    min: int = 1
    max: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchSpace:
    knobs: Mapping[str, tuple[Any, ...] | Rule]
    """Knob -> candidate values or a rule; a knob left out stays at its ParallelPlan default."""
    source: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanContext:
    """What every plan of one search shares."""

    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    seq_len: int
    dp: int | None = None
    """A pinned DP degree (``--dp``), else None."""
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    """Share of device memory a recommended plan leaves free (``autotune/headroom.py``)."""
    moe_capacity_factor: float | None = None
    """The user's token dropping (``--moe-capacity-factor``), on every plan like the batch: never tuned."""
    moe_load_imbalance: float = 1.0
    """The user's measured routing imbalance (``--moe-load-imbalance``), on every plan: never tuned."""

    weight_dtype: StoreDtype = StoreDtype.FP32
    """The user's stored dtypes (``--weight-dtype``, ``--adam-dtype``, ``--loss-kernel``), on every plan like
    the batch: numerics that change convergence, never tuned."""
    adam_dtype: StoreDtype | None = None
    loss_kernel: LossKernel = LossKernel.FP32
    precision_aware_optimizer: bool = False
    """The user's Megatron optimizer (``--precision-aware-optimizer``, ``--grad-reduce-dtype``), on every
    plan: only Megatron plans (with its distributed optimizer for the first) run them (``spacerules``)."""
    grad_reduce_dtype: GradDtype | None = None

    def routing(self) -> dict[str, Any]:
        """The plan fields of the user's MoE routing, the same on every plan of the search."""
        return {
            "moe_capacity_factor": self.moe_capacity_factor,
            "moe_load_imbalance": self.moe_load_imbalance,
        }

    def stored(self) -> dict[str, Any]:
        """The plan fields of the user's stored dtypes and Megatron optimizer, the same on every plan."""
        return {name: getattr(self, name) for name in _STORED}

    def stored_json(self) -> dict[str, Any]:
        """``stored`` as a study's JSON holds it (``stored_fields`` reads it back); the Megatron optimizer
        only when set, so a study made before it keeps its identity."""
        out: dict[str, Any] = {k: None if v is None else str(v) for k, v in self.stored().items()}
        if not self.megatron_optimizer:
            del out["precision_aware_optimizer"], out["grad_reduce_dtype"]
        else:
            out["precision_aware_optimizer"] = self.precision_aware_optimizer
        return out

    @property
    def custom_numerics(self) -> bool:
        """Weights or moments in bf16, or a loss kernel other than eager fp32."""
        return (
            StoreDtype.BF16 in (self.weight_dtype, self.adam_dtype) or self.loss_kernel is not LossKernel.FP32
        )

    @property
    def megatron_optimizer(self) -> bool:
        """The precision-aware optimizer or a gradient-reduce dtype asked for (Megatron plans only)."""
        return self.precision_aware_optimizer or self.grad_reduce_dtype is not None


_STORED = ("weight_dtype", "adam_dtype", "loss_kernel", "precision_aware_optimizer", "grad_reduce_dtype")
_KINDS = {
    "weight_dtype": StoreDtype,
    "adam_dtype": StoreDtype,
    "loss_kernel": LossKernel,
    "grad_reduce_dtype": GradDtype,
}


def stored_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """The user's stored dtypes, loss kernel and Megatron optimizer as ``PlanContext`` takes them (flags, a
    study's JSON)."""
    return {k: bool(v) if k not in _KINDS else None if v is None else _KINDS[k](v) for k, v in values.items()}


# ---------------------------------------------------------------------------------------------- loading
def load_space(name_or_path: str | None = None) -> SearchSpace:
    """``None``: search_spaces/default.yaml; a bare name (``deepspeed``): the bundled file; else a path."""
    path = Path(name_or_path) if name_or_path else _SPACES_DIR / "default.yaml"
    if name_or_path and not path.suffix and (_SPACES_DIR / f"{name_or_path}.yaml").exists():
        path = _SPACES_DIR / f"{name_or_path}.yaml"
    where = str(path)
    try:
        data = yaml.safe_load(read_text(path, "--space"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of knobs to candidates at the top level")
    knobs = {}
    for key, value in data.items():
        if key not in KNOBS:
            hint = _NOT_KNOBS.get(key, f"allowed: {', '.join(KNOBS)}")
            raise ConfigError(f"{where}: unknown knob {key!r}; {hint}")
        parse = _parse_rule if isinstance(value, dict) else _parse_list
        knobs[key] = parse(key, value, where)
    return SearchSpace(knobs=knobs, source=where)


def _parse_list(key: str, value: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(
            f"{where}: knob '{key}' must be a non-empty list of values or a rule mapping "
            f"({{rule: ...}}), got {value!r}"
        )
    return tuple(dict.fromkeys(_parse_value(key, v, where) for v in value))


def _parse_value(key: str, value: Any, where: str) -> Any:
    if key == "offload_modules":
        return _parse_modules(value, where)
    if key in _ENUMS:
        try:
            return _ENUMS[key](value)
        except ValueError:
            allowed = ", ".join(str(e.value) for e in _ENUMS[key])
            raise ConfigError(f"{where}: knob '{key}' has bad value {value!r}; allowed: {allowed}") from None
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: knob '{key}' takes true/false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: knob '{key}' takes positive integers, got {value!r}")
    return value


def _parse_modules(value: Any, where: str) -> tuple[str, ...]:
    """An ``offload_modules`` candidate: a list of Megatron module names (the space file), or its plain form
    (``planenums.plain``: ``"expert_fc1+moe_act"``, ``"none"``) as Optuna stores it."""
    names = ([] if value == "none" else value.split("+")) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or any(n not in OFFLOAD_MODULES for n in names):
        raise ConfigError(
            f"{where}: knob 'offload_modules' takes lists of {', '.join(OFFLOAD_MODULES)} ([] for none), "
            f"got {value!r}"
        )
    return tuple(names)


def _parse_rule(key: str, value: dict[str, Any], where: str) -> Rule:
    if key in _ENUMS or key in _BOOLS or key == "offload_modules":
        raise ConfigError(f"{where}: knob '{key}' takes a list of values, not a rule")
    extra = sorted(set(value) - {"rule", "min", "max"}, key=str)
    if extra:
        raise ConfigError(f"{where}: knob '{key}' has unknown rule key {extra[0]!r}; allowed: rule, min, max")
    if value.get("rule") not in _RULES:
        raise ConfigError(
            f"{where}: knob '{key}' has unknown rule {value.get('rule')!r}; allowed: {', '.join(_RULES)}"
        )
    bounds = {b: _parse_value(key, value[b], where) for b in ("min", "max") if b in value}
    return Rule(value["rule"], **bounds)


# ---------------------------------------------------------------------------------------------- choices
def resolve_choices(
    space: SearchSpace, model: ModelSpec, cluster: ClusterSpec, pins: Mapping[str, Any] | None = None
) -> dict[str, tuple[Any, ...]]:
    """Concrete candidates per knob: rules evaluated, pins (``--tp 8``) replacing the space's values."""
    pins = {k: v for k, v in (pins or {}).items() if v is not None and k in KNOBS}
    out: dict[str, tuple[Any, ...]] = {}
    for knob in KNOBS:
        if knob in pins:
            out[knob] = (_parse_value(knob, pins[knob], "pin"),)
        elif isinstance(spec := space.knobs.get(knob), Rule):
            out[knob] = _rule_values(spec, model, cluster)
        else:
            values = spec or (_DEFAULTS[knob],)
            out[knob] = tuple(_parse_value(knob, v, space.source) if v is not None else v for v in values)
        if knob in ("ep", "etp") and not model.is_moe:  # expert parallelism is only offered for MoE models
            if out[knob] != (1,) and knob in pins:
                raise ConfigError(
                    f"--{knob} {pins[knob]}: {model.name} is a dense model (no routed "
                    "experts); expert parallelism needs an MoE model"
                )
            out[knob] = (1,)
        if knob == "offload_modules" and not model.is_moe:  # it offloads routed-expert inputs
            out[knob] = ((),)
        if knob == "moe_a2a_overlap" and not model.is_moe:  # the EP overlap needs routed experts
            if pins.get(knob):
                raise ConfigError(
                    f"--moe-a2a-overlap: {model.name} is a dense model (no expert all-to-all to overlap); "
                    "drop the flag"
                )
            out[knob] = (False,)
        if not out[knob]:
            raise ConfigError(
                f"{space.source}: knob '{knob}' has no candidates for {model.name} on {cluster.name}"
            )
    return out


def _rule_values(rule: Rule, model: ModelSpec, cluster: ClusterSpec) -> tuple[int, ...]:
    top = rule.max if rule.max is not None else 1 << 20
    if rule.name == "powers_of_two":
        values = [1 << i for i in range(21)]
    elif rule.name == "divisors_of_experts":
        n = model.num_experts
        values = [d for d in range(1, n + 1) if n % d == 0] if n else [1]
    else:
        n = cluster.gpus_per_node if rule.name == "divisors_of_gpus_per_node" else model.num_layers
        if rule.name == "divisors_of_layers":  # also the uneven splits the frameworks make (stagesplit.py)
            values = [d for d in range(1, n + 3) if pipeline_degree_ok(n, d)]
        else:
            values = [d for d in range(1, n + 1) if n % d == 0]
    return tuple(v for v in values if rule.min <= v <= top)


# ---------------------------------------------------------------------------------------------- Optuna
def suggest_plan(
    trial: Any, choices: Mapping[str, list[Any]], ctx: PlanContext
) -> tuple[ParallelPlan | None, str | None]:
    """One ``suggest_categorical`` per knob (fixed choices); ``(plan, None)`` or ``(None, rule broken)``."""
    params = {knob: trial.suggest_categorical(knob, list(choices[knob])) for knob in KNOBS}
    return plan_from_params(params, ctx)


def plan_from_params(params: Mapping[str, Any], ctx: PlanContext) -> tuple[ParallelPlan | None, str | None]:
    """The plan a trial's parameters describe, checked by the enumerator's rules in the same order."""
    tp, pp, cp, mbs = (int(params[k]) for k in ("tp", "pp", "cp", "micro_batch"))
    if ctx.dp is not None and tp * pp * cp * ctx.dp != ctx.cluster.num_gpus:
        return None, "TP x PP x CP x DP does not equal the GPU count (DP is pinned)"
    reason = layout_rule(ctx, tp, pp, cp)
    if reason:
        return None, reason
    dp = ctx.cluster.num_gpus // (tp * pp * cp)
    if ctx.global_batch % (dp * mbs):
        return None, BATCH_RULE
    v: dict[str, Any] = {
        k: _parse_value(k, params[k], "trial") if params[k] is not None else None for k in Variant._fields
    }
    interleaved, v_shape = pp > 1 and v["schedule"].looped, v["schedule"].v_shape
    variant = collapse(
        Variant(
            **{
                **v,
                "schedule": v["schedule"] if pp > 1 else Schedule.ONE_F_ONE_B,
                "virtual_stages": v["virtual_stages"] if interleaved else 2 if pp > 1 and v_shape else 1,
                "hsdp_shard_size": v["hsdp_shard_size"] if v["sharding"] is Sharding.HSDP else None,
                "sequence_parallel": v["sequence_parallel"] and tp > 1,
            }
        ),
        tp,
        cp,
    )
    reason = variant_rule(ctx, variant, tp, pp, cp, dp) or pipeline_rule(
        variant.schedule, pp, ctx.global_batch // (dp * mbs)
    )
    if reason:
        return None, reason
    try:
        return ParallelPlan(
            tp=tp,
            pp=pp,
            dp=dp,
            cp=cp,
            micro_batch=mbs,
            global_batch=ctx.global_batch,
            seq_len=ctx.seq_len,
            **ctx.routing(),
            **ctx.stored(),
            **variant._asdict(),
        ), None
    except ConfigError as e:  # a plan-only rule spacerules does not prune by (a test catches it)
        return None, str(e)


def params_of(plan: ParallelPlan) -> dict[str, Any]:
    """A plan as trial parameters (for ``enqueue_trial``): the inverse of ``plan_from_params``."""
    return {knob: plain(getattr(plan, knob)) for knob in KNOBS}
