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

The rules mirror ``plan_errors`` and ``check_plan`` in ``plan.py``; ``tests/test_space.py`` checks the two
agree by brute force.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from itertools import product
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from autotune import plan as _plan
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM
from autotune.plan import (
    CpComm,
    Fp8Recipe,
    Framework,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Sharding,
)
from autotune.specs import ClusterSpec, ModelSpec
from autotune.stagesplit import pipeline_degree_ok, split_error
from autotune.userfile import read_text

__all__ = [
    "KNOBS", "BATCH_RULE", "Rule", "SearchSpace", "PlanContext", "Ladder", "Tally", "load_space",
    "resolve_choices", "enumerate_plans", "layout_dps", "suggest_plan", "plan_from_params", "params_of",
]

KNOBS = ("tp", "pp", "cp", "micro_batch", "framework", "sharding", "hsdp_shard_size", "offload", "schedule",
         "virtual_stages", "recompute", "sequence_parallel", "precision", "ep", "etp", "fp8_recipe",
         "compile", "async_tp", "tp_comm_overlap", "cp_comm")
_ENUMS: dict[str, type[Enum]] = {"framework": Framework, "sharding": Sharding, "schedule": Schedule,
                                 "recompute": Recompute, "precision": Precision, "fp8_recipe": Fp8Recipe,
                                 "cp_comm": CpComm}
_BOOLS = frozenset({"offload", "sequence_parallel", "compile", "async_tp", "tp_comm_overlap"})
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ParallelPlan) if f.name in KNOBS}
_RULES = ("divisors_of_gpus_per_node", "divisors_of_layers", "powers_of_two", "divisors_of_experts")
_NOT_KNOBS = {"dp": "DP is derived: GPUs / (tp x pp x cp); pin it with --dp",
              "global_batch": "the global batch is yours, never tuned: pass --global-batch",
              "seq_len": "the sequence length is yours, never tuned: pass --seq-len"}
_SPACES_DIR = Path(str(resources.files("autotune.search_spaces")))
"""The top-level search_spaces/ folder, shipped inside the package as ``autotune.search_spaces``."""

BATCH_RULE = "global batch is not divisible by DP x micro-batch"


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
        raise ConfigError(f"{where}: knob '{key}' must be a non-empty list of values or a rule mapping "
                          f"({{rule: ...}}), got {value!r}")
    return tuple(dict.fromkeys(_parse_value(key, v, where) for v in value))


def _parse_value(key: str, value: Any, where: str) -> Any:
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


def _parse_rule(key: str, value: dict[str, Any], where: str) -> Rule:
    if key in _ENUMS or key in _BOOLS:
        raise ConfigError(f"{where}: knob '{key}' takes a list of values, not a rule")
    extra = sorted(set(value) - {"rule", "min", "max"})
    if extra:
        raise ConfigError(f"{where}: knob '{key}' has unknown rule key '{extra[0]}'; allowed: rule, min, max")
    if value.get("rule") not in _RULES:
        raise ConfigError(f"{where}: knob '{key}' has unknown rule {value.get('rule')!r}; "
                          f"allowed: {', '.join(_RULES)}")
    bounds = {b: _parse_value(key, value[b], where) for b in ("min", "max") if b in value}
    return Rule(value["rule"], **bounds)


# ---------------------------------------------------------------------------------------------- choices
def resolve_choices(space: SearchSpace, model: ModelSpec, cluster: ClusterSpec,
                    pins: Mapping[str, Any] | None = None) -> dict[str, tuple[Any, ...]]:
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
                raise ConfigError(f"--{knob} {pins[knob]}: {model.name} is a dense model (no routed "
                                  "experts); expert parallelism needs an MoE model")
            out[knob] = (1,)
        if not out[knob]:
            raise ConfigError(f"{space.source}: knob '{knob}' has no candidates for {model.name} "
                              f"on {cluster.name}")
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


# ---------------------------------------------------------------------------------------------- rules
class _Variant(NamedTuple):
    """Everything but the layout and the micro-batch."""

    framework: Framework
    sharding: Sharding
    hsdp_shard_size: int | None
    offload: bool
    schedule: Schedule
    virtual_stages: int
    recompute: Recompute
    sequence_parallel: bool
    precision: Precision
    ep: int = 1
    etp: int = 1
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
    compile: bool = False
    async_tp: bool = False
    tp_comm_overlap: bool = False
    cp_comm: CpComm = CpComm.P2P


def _collapse(v: _Variant, tp: int, cp: int) -> _Variant:
    """Speed knobs that do not matter in this combination, at their defaults (as SP is without TP): the fp8
    recipe without fp8, compile and async TP outside the torch framework (async TP also without TP or
    compile), TP-comm overlap outside Megatron or without SP, the CP exchange without CP."""
    torch_fw, fp8 = v.framework is Framework.FSDP, v.precision is Precision.FP8
    return v._replace(
        fp8_recipe=v.fp8_recipe if fp8 else Fp8Recipe.TENSORWISE,
        compile=v.compile and torch_fw,
        async_tp=v.async_tp and torch_fw and v.compile and tp > 1,
        tp_comm_overlap=(v.tp_comm_overlap and v.framework is Framework.MEGATRON and v.sequence_parallel
                         and tp > 1),
        cp_comm=v.cp_comm if cp > 1 else CpComm.P2P)


def _knob_rule(ctx: PlanContext, v: _Variant, tp: int, cp: int) -> str | None:
    """Mirror of ``plan._knob_errors`` and the a2a head rule of ``check_plan``."""
    if v.precision is Precision.FP8 and v.fp8_recipe not in _plan.FP8_RECIPES[v.framework] \
            and _plan.FP8_RECIPES[v.framework]:
        return "the framework has no such fp8 recipe"
    if cp > 1 and v.cp_comm is CpComm.A2A:
        if v.framework is not Framework.MEGATRON:
            return "cp-comm a2a runs in Megatron only"
        if ctx.model.num_heads % (tp * cp):
            return "cp-comm a2a needs TP x CP to divide the heads"
    return None


def _layout_rule(ctx: PlanContext, tp: int, pp: int, cp: int) -> str | None:
    model = ctx.model
    if model.num_heads % tp:
        return "TP does not divide the attention heads"
    if model.num_kv_heads % tp:
        return "TP does not divide the KV heads"
    if model.ffn_hidden_size % tp:
        return "TP does not divide the MLP width"
    if pp > model.num_layers:
        return "PP exceeds the layers"
    if ctx.cluster.num_gpus % (tp * pp * cp):
        return "TP x PP x CP does not divide the GPU count"
    if cp > 1 and ctx.seq_len % (2 * cp):
        return "seq-len is not divisible by 2 x CP"
    return None


def _variant_rule(ctx: PlanContext, v: _Variant, tp: int, pp: int, cp: int, dp: int) -> str | None:
    sharding, fw = v.sharding, v.framework
    if sharding not in _plan.FRAMEWORK_SHARDING[fw]:  # plan.py owns the table of what each framework offers
        return "the framework does not offer this sharding"
    if sharding is not Sharding.NONE and dp == 1:
        return "sharding needs DP > 1"
    size = v.hsdp_shard_size
    if sharding is Sharding.HSDP and (size is None or not 1 < size < dp or dp % size):
        return "the HSDP shard group must divide DP (1 < size < DP)"
    if v.offload and sharding is Sharding.NONE:
        return "offload needs a sharded optimizer"
    if fw is Framework.MEGATRON and sharding is Sharding.FSDP_FULL and (pp > 1 or v.offload):
        return "Megatron-FSDP is priced without pipelining or offload"
    if fw is Framework.DEEPSPEED and (reason := _deepspeed_rule(v, tp, pp, cp)):
        return reason
    if v.schedule is Schedule.INTERLEAVED and v.virtual_stages < 2:
        return "the interleaved schedule needs virtual stages >= 2"
    if pp > 1 and split_error(ctx.model.num_layers, pp, v.virtual_stages, str(fw)):
        return "the framework cannot split the layers into PP x virtual stages"
    if not ctx.cluster.gpu.supports(str(v.precision)):
        return "the GPU lacks this precision"
    return _expert_rule(ctx.model, v, tp, cp, dp) or _knob_rule(ctx, v, tp, cp)


def _expert_rule(model: ModelSpec, v: _Variant, tp: int, cp: int, dp: int) -> str | None:
    """``plan._expert_errors`` and ``plan._expert_model_errors``, as rules."""
    ep, etp, fw = v.ep, v.etp, v.framework
    if not model.is_moe:
        return "EP/ETP > 1 on a dense model" if ep > 1 or etp > 1 else None
    if model.num_experts % ep:
        return "EP does not divide the routed experts"
    if model.expert_ffn_hidden_size % etp:
        return "ETP does not divide the expert width"
    if fw is Framework.MEGATRON:
        if tp > 1 and not v.sequence_parallel:
            return "Megatron MoE with TP > 1 needs sequence parallelism"
        if (tp * dp * cp) % (ep * etp):
            return "Megatron: EP x ETP does not divide TP x DP x CP"
    if fw is Framework.FSDP and (ep > 1 or etp > 1):
        shard = 1 if v.sharding is Sharding.NONE else (v.hsdp_shard_size or dp)
        if etp not in (1, tp) or (shard * cp * (tp // etp)) % ep:
            return "torchtitan: EP must divide dp_shard x CP (x TP with ETP 1), ETP in {1, TP}"
    if fw is Framework.DEEPSPEED and (ep > 1 or etp > 1):
        if etp > 1 or tp > 1:
            return "DeepSpeed-MoE is priced with TP = ETP = 1"
        if dp % ep:
            return "DeepSpeed-MoE: EP does not divide DP"
        if v.sharding is Sharding.ZERO3:
            return "DeepSpeed-MoE does not run with ZeRO-3"
    return None


def _deepspeed_rule(v: _Variant, tp: int, pp: int, cp: int) -> str | None:
    if pp > 1 and v.sharding in (Sharding.ZERO2, Sharding.ZERO3):
        return "DeepSpeed's pipeline engine rejects ZeRO-2/3"
    if pp > 1 and tp > 1:
        return "DeepSpeed's pipeline engine fails with TP"
    if pp > 1 and v.schedule is not Schedule.ONE_F_ONE_B:
        return "DeepSpeed's pipeline engine runs 1F1B only"
    if cp > 1:
        return "DeepSpeed has no context parallelism"
    if v.precision is Precision.FP8:
        return "DeepSpeed has no fp8 training path"
    if v.sequence_parallel:
        return "DeepSpeed AutoTP has no sequence parallelism"
    return None


def _pipeline_rule(schedule: Schedule, pp: int, num_microbatches: int) -> str | None:
    if pp > 1 and schedule is not Schedule.GPIPE and num_microbatches < pp:
        return "1F1B needs micro-batches per step >= PP"
    if pp > 1 and schedule is Schedule.INTERLEAVED and num_microbatches % pp:
        return "interleaved needs micro-batches per step divisible by PP"
    return None


# ---------------------------------------------------------------------------------------------- enumeration
@dataclass(frozen=True, slots=True)
class Ladder:
    """Legal plans that differ only in micro-batch, smallest first."""

    fields: dict[str, Any]
    micro_batches: tuple[int, ...]

    def plan(self, micro_batch: int) -> ParallelPlan:
        return ParallelPlan(micro_batch=micro_batch, **self.fields)


@dataclass
class Tally:
    """What an enumeration saw: illegal combinations by rule, and the values legal plans use per knob."""

    pruned: Counter[str] = field(default_factory=Counter)
    legal_values: dict[str, set[Any]] = field(default_factory=lambda: {k: set() for k in KNOBS})
    num_legal: int = 0

    def count(self, reason: str, n: int) -> None:
        if n:
            self.pruned[reason] += n

    def record(self, ladder: Ladder) -> None:
        self.num_legal += len(ladder.micro_batches)
        for knob in KNOBS:
            if knob != "micro_batch":
                self.legal_values[knob].add(ladder.fields[knob])
        self.legal_values["micro_batch"].update(ladder.micro_batches)

    def choices(self) -> dict[str, list[Any]]:
        """The legal values as plain JSON/Optuna values, sorted: the categorical choices of the study."""
        return {k: sorted((_plain(v) for v in vs), key=lambda x: (x is not None, x))
                for k, vs in self.legal_values.items()}


def enumerate_plans(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext,
                    tally: Tally | None = None) -> Iterator[Ladder]:
    """Every legal plan of ``choices``, as micro-batch ladders; illegal combinations counted in ``tally``."""
    tally = tally if tally is not None else Tally()
    variants: dict[tuple[int, bool, int], list[_Variant]] = {}
    num_mbs = len(choices["micro_batch"])
    for tp, pp, cp in product(choices["tp"], choices["pp"], choices["cp"]):
        if ctx.dp is not None and tp * pp * cp * ctx.dp != ctx.cluster.num_gpus:
            continue  # --dp pins the layout: other layouts are outside the space, not pruned
        key = (tp, pp > 1, cp)
        if key not in variants:
            variants[key] = _variants(choices, *key)
        reason = _layout_rule(ctx, tp, pp, cp)
        if reason:
            tally.count(reason, len(variants[key]) * num_mbs)
            continue
        dp = ctx.cluster.num_gpus // (tp * pp * cp)
        mbs = tuple(m for m in choices["micro_batch"] if ctx.global_batch % (dp * m) == 0)
        tally.count(BATCH_RULE, len(variants[key]) * (num_mbs - len(mbs)))
        if mbs:
            yield from _ladders(ctx, variants[key], (tp, pp, cp, dp), mbs, tally)


def _ladders(ctx: PlanContext, variants: list[_Variant], layout: tuple[int, int, int, int],
             mbs: tuple[int, ...], tally: Tally) -> Iterator[Ladder]:
    tp, pp, cp, dp = layout
    for v in variants:
        reason = _variant_rule(ctx, v, tp, pp, cp, dp)
        if reason:
            tally.count(reason, len(mbs))
            continue
        good = []
        for m in mbs:
            reason = _pipeline_rule(v.schedule, pp, ctx.global_batch // (dp * m))
            if reason:
                tally.count(reason, 1)
            else:
                good.append(m)
        if good:
            ladder = Ladder({"tp": tp, "pp": pp, "dp": dp, "cp": cp, "global_batch": ctx.global_batch,
                             "seq_len": ctx.seq_len, **v._asdict()}, tuple(good))
            tally.record(ladder)
            yield ladder


def _variants(choices: Mapping[str, tuple[Any, ...]], tp: int, pp_gt1: bool, cp: int) -> list[_Variant]:
    """The non-layout combinations, with knobs that do not matter here collapsed to their default."""
    tp_gt1 = tp > 1
    schedules = [(s, v) for s in choices["schedule"]
                 for v in (choices["virtual_stages"] if s is Schedule.INTERLEAVED else (1,))]
    schedules = list(dict.fromkeys(schedules)) if pp_gt1 else [(Schedule.ONE_F_ONE_B, 1)]
    sps = choices["sequence_parallel"] if tp_gt1 else (False,)  # a pin of True collapses too: SP needs TP
    out = []
    speeds: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}  # (fw, sp, prec) -> the speed knobs that matter
    for fw, sharding in product(choices["framework"], choices["sharding"]):
        for hsdp in (choices["hsdp_shard_size"] if sharding is Sharding.HSDP else (None,)):
            rest = product(choices["offload"], schedules, choices["recompute"], sps, choices["precision"],
                           choices["ep"], choices["etp"])
            for offload, (sched, vs), rc, sp, prec, ep, etp in rest:
                v = _Variant(fw, sharding, hsdp, offload, sched, vs, rc, sp, prec, ep, etp)
                key = (fw, sp, prec)
                if key not in speeds:  # collapse before multiplying: most combinations leave one value each
                    collapsed = (_collapse(v._replace(**dict(zip(_SPEED, speed, strict=True))), tp, cp)
                                 for speed in product(*(choices[k] for k in _SPEED)))
                    speeds[key] = list(dict.fromkeys(tuple(getattr(c, k) for k in _SPEED) for c in collapsed))
                out += [v._replace(**dict(zip(_SPEED, speed, strict=True))) for speed in speeds[key]]
    return list(dict.fromkeys(out))


_SPEED = ("fp8_recipe", "compile", "async_tp", "tp_comm_overlap", "cp_comm")


def layout_dps(choices: Mapping[str, tuple[Any, ...]], ctx: PlanContext) -> set[int]:
    """DP degrees of the layouts that pass the layout rules (the global batch is not looked at)."""
    dps = set()
    for tp, pp, cp in product(choices["tp"], choices["pp"], choices["cp"]):
        if not _layout_rule(ctx, tp, pp, cp):
            dp = ctx.cluster.num_gpus // (tp * pp * cp)
            if ctx.dp is None or dp == ctx.dp:
                dps.add(dp)
    return dps


# ---------------------------------------------------------------------------------------------- Optuna
def suggest_plan(trial: Any, choices: Mapping[str, list[Any]],
                 ctx: PlanContext) -> tuple[ParallelPlan | None, str | None]:
    """One ``suggest_categorical`` per knob (fixed choices); ``(plan, None)`` or ``(None, rule broken)``."""
    params = {knob: trial.suggest_categorical(knob, list(choices[knob])) for knob in KNOBS}
    return plan_from_params(params, ctx)


def plan_from_params(params: Mapping[str, Any], ctx: PlanContext) -> tuple[ParallelPlan | None, str | None]:
    """The plan a trial's parameters describe, checked by the enumerator's rules in the same order."""
    tp, pp, cp, mbs = (int(params[k]) for k in ("tp", "pp", "cp", "micro_batch"))
    if ctx.dp is not None and tp * pp * cp * ctx.dp != ctx.cluster.num_gpus:
        return None, "TP x PP x CP x DP does not equal the GPU count (DP is pinned)"
    reason = _layout_rule(ctx, tp, pp, cp)
    if reason:
        return None, reason
    dp = ctx.cluster.num_gpus // (tp * pp * cp)
    if ctx.global_batch % (dp * mbs):
        return None, BATCH_RULE
    v: dict[str, Any] = {k: _parse_value(k, params[k], "trial") if params[k] is not None else None
                         for k in _Variant._fields}
    interleaved = pp > 1 and v["schedule"] is Schedule.INTERLEAVED
    variant = _collapse(_Variant(**{
        **v, "schedule": v["schedule"] if pp > 1 else Schedule.ONE_F_ONE_B,
        "virtual_stages": v["virtual_stages"] if interleaved else 1,
        "hsdp_shard_size": v["hsdp_shard_size"] if v["sharding"] is Sharding.HSDP else None,
        "sequence_parallel": v["sequence_parallel"] and tp > 1}), tp, cp)
    reason = (_variant_rule(ctx, variant, tp, pp, cp, dp)
              or _pipeline_rule(variant.schedule, pp, ctx.global_batch // (dp * mbs)))
    if reason:
        return None, reason
    try:
        return ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mbs, global_batch=ctx.global_batch,
                            seq_len=ctx.seq_len, **variant._asdict()), None
    except ConfigError as e:  # a rule plan.py has and this module does not mirror yet (a test catches it)
        return None, str(e)


def params_of(plan: ParallelPlan) -> dict[str, Any]:
    """A plan as trial parameters (for ``enqueue_trial``): the inverse of ``plan_from_params``."""
    return {knob: _plain(getattr(plan, knob)) for knob in KNOBS}


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value
