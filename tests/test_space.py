"""Search spaces as data: validation, pins, and an enumerator that agrees with ParallelPlan by brute force."""

import itertools
import json

import optuna
import pytest

from autotune.catalog import load_model, make_cluster
from autotune.errors import ConfigError
from autotune.plan import (
    CpComm,
    Fp8Recipe,
    Framework,
    ParallelPlan,
    Precision,
    Schedule,
    Sharding,
    check_plan,
)
from autotune.space import (
    KNOBS,
    PlanContext,
    SearchSpace,
    Tally,
    enumerate_plans,
    load_space,
    params_of,
    plan_from_params,
    resolve_choices,
    stored_fields,
    suggest_plan,
)

# Small enough to brute-force, wide enough to hit every rule: TP 8 breaks the KV heads of "small" (4),
# a100 has no fp8, DeepSpeed and Megatron lack some shardings, HSDP sizes that do not divide DP, pipelines
# with too few micro-batches, interleaving that does not divide the layers.
_WIDE = {
    "tp": (1, 2, 8),
    "pp": (1, 2, 8),
    "cp": (1, 2),
    "micro_batch": (1, 2, 4),
    "framework": ("fsdp", "deepspeed", "megatron"),
    "sharding": tuple(s.value for s in Sharding),
    "hsdp_shard_size": (2, 4),
    "offload": (False, True),
    "schedule": ("1f1b", "interleaved", "gpipe", "zbv"),
    "virtual_stages": (1, 2, 3),
    "recompute": ("full",),
    "sequence_parallel": (False, True),
    "precision": ("bf16", "fp8"),
    "fp8_recipe": ("tensorwise", "rowwise"),
    "compile": (False, True),
    "async_tp": (False, True),
    "tp_comm_overlap": (False, True),
    "cp_comm": ("p2p", "a2a"),
}


def _space(tmp_path, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_space(str(path))


def _wide_setup(**stored):
    model, cluster = load_model("small"), make_cluster(num_gpus=8, gpu="a100-80gb")
    knobs = {**_WIDE, **(_STORED_NARROW if stored else {})}
    space = SearchSpace(knobs={k: tuple(v) for k, v in knobs.items()}, source="wide")
    choices = resolve_choices(space, model, cluster)
    ctx = PlanContext(model=model, cluster=cluster, global_batch=16, seq_len=512, **stored_fields(stored))
    return choices, ctx


# The user's numerics on every plan: Megatron's bf16 moments under its precision-aware optimizer (a
# gradient-reduce dtype on a non-Megatron plan: tests/costmodel/test_megatron_moments.py).
_STORED_NARROW = {
    "framework": ("fsdp", "megatron"),
    "schedule": ("1f1b", "interleaved"),
    "virtual_stages": (1, 2),
    "precision": ("bf16",),
    "compile": (False,),
    "async_tp": (False,),
    "cp_comm": ("p2p",),
}
"""The knobs the stored numerics' rules do not read, narrowed for that case (suite time)."""
_STORED_CASES = [
    {},
    {"adam_dtype": "bf16", "precision_aware_optimizer": True, "loss_kernel": "fused"},
]


def _normalised(combo):
    """Knobs that do not matter collapse: the enumerator's dedupe, written out independently."""
    p = dict(zip(KNOBS, combo, strict=True))
    if p["pp"] == 1:
        p["schedule"] = Schedule.ONE_F_ONE_B
    if p["schedule"].v_shape:
        p["virtual_stages"] = 2  # ZBV's V: two chunks per rank
    elif not p["schedule"].looped:
        p["virtual_stages"] = 1
    if p["sharding"] is not Sharding.HSDP:
        p["hsdp_shard_size"] = None
    if p["tp"] == 1:
        p["sequence_parallel"] = False
    fsdp = p["framework"] is Framework.FSDP
    if p["precision"] is not Precision.FP8:
        p["fp8_recipe"] = Fp8Recipe.TENSORWISE
    p["compile"] = p["compile"] and fsdp
    p["async_tp"] = p["async_tp"] and p["compile"] and p["tp"] > 1
    p["tp_comm_overlap"] = (
        p["tp_comm_overlap"] and p["framework"] is Framework.MEGATRON and p["sequence_parallel"]
    )
    if p["cp"] == 1:
        p["cp_comm"] = CpComm.P2P
    return tuple(p.items())


def _legal_by_plan_rules(params, ctx):
    p = dict(params)
    world = p["tp"] * p["pp"] * p["cp"]
    if ctx.cluster.num_gpus % world:
        return None
    try:
        plan = ParallelPlan(
            dp=ctx.cluster.num_gpus // world,
            global_batch=ctx.global_batch,
            seq_len=ctx.seq_len,
            **ctx.stored(),
            **p,
        )
    except ConfigError:
        return None
    return None if check_plan(plan, ctx.model, ctx.cluster) else plan


def test_bundled_spaces_load_and_cover_every_knob():
    default = load_space()
    assert set(default.knobs) == set(KNOBS)
    for name in ("fsdp", "deepspeed", "megatron"):
        assert load_space(name).knobs["framework"] == (load_space(name).knobs["framework"][0],)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tp: [1, 2]\nzero_stage: [1]\n", "unknown knob 'zero_stage'; allowed: tp, pp, cp"),
        ("dp: [2]\n", "unknown knob 'dp'; DP is derived"),
        ("sharding: [zero9]\n", "knob 'sharding' has bad value 'zero9'; allowed: none, zero1"),
        ("tp: [0, 2]\n", "knob 'tp' takes positive integers, got 0"),
        ("offload: [yes please]\n", "knob 'offload' takes true/false"),
        ("pp: {rule: primes}\n", "unknown rule 'primes'; allowed: divisors_of_gpus_per_node"),
        ("pp: {rule: powers_of_two, maximum: 4}\n", "unknown rule key 'maximum'"),
        ("recompute: {rule: powers_of_two}\n", "knob 'recompute' takes a list of values"),
        ("cp: []\n", "knob 'cp' must be a non-empty list"),
        ("- tp\n", "expected a mapping of knobs"),
    ],
)
def test_bad_space_files_name_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _space(tmp_path, text)


def test_rules_and_pins_resolve_to_candidates(tmp_path):
    model, cluster = load_model("70b"), make_cluster(num_gpus=16)
    space = _space(
        tmp_path,
        "tp: {rule: divisors_of_gpus_per_node}\n"
        "pp: {rule: divisors_of_layers, max: 16}\n"
        "cp: {rule: powers_of_two, min: 2, max: 8}\n",
    )
    choices = resolve_choices(space, model, cluster)
    assert choices["tp"] == (1, 2, 4, 8) and choices["pp"] == (1, 2, 4, 5, 8, 10, 16)
    assert choices["cp"] == (2, 4, 8)
    assert [str(f) for f in choices["framework"]] == ["fsdp"]  # left out: the plan's default
    pinned = resolve_choices(space, model, cluster, {"tp": 8, "framework": "deepspeed", "recompute": None})
    assert pinned["tp"] == (8,) and str(pinned["framework"][0]) == "deepspeed"


@pytest.mark.slow
@pytest.mark.parametrize("stored", _STORED_CASES, ids=["fp32", "megatron-bf16-moments"])
def test_enumerator_agrees_with_parallel_plan_by_brute_force(stored):
    choices, ctx = _wide_setup(**stored)
    tally = Tally()
    ladders = list(enumerate_plans(choices, ctx, tally))
    enumerated = [ladder.plan(m) for ladder in ladders for m in ladder.micro_batches]
    combos = {_normalised(c) for c in itertools.product(*(choices[k] for k in KNOBS))}
    brute = [plan for c in combos if (plan := _legal_by_plan_rules(c, ctx)) is not None]
    assert {tuple(p.to_dict().items()) for p in enumerated} == {tuple(p.to_dict().items()) for p in brute}
    assert len(enumerated) == len(brute) == tally.num_legal
    assert tally.num_legal + sum(tally.pruned.values()) == len(combos)  # every combination counted once
    for reason in (
        "TP does not divide the KV heads",
        "the GPU lacks this precision",
        "sharding needs DP > 1",
        "the framework does not offer this sharding",
        "1F1B needs micro-batches per step >= PP",
    ):
        assert tally.pruned[reason] > 0 or (stored and reason == "the GPU lacks this precision"), reason
    if stored:
        assert {str(p.framework) for p in enumerated} == {"megatron"}
        assert all(p.precision_aware_optimizer for p in enumerated)
        assert tally.pruned["the precision-aware optimizer needs Megatron's distributed optimizer"] > 0
    assert all(list(ladder.micro_batches) == sorted(ladder.micro_batches) for ladder in ladders)


@pytest.mark.slow
def test_trial_params_map_to_the_same_legality():
    choices, ctx = _wide_setup()
    tally = Tally()
    legal = {
        tuple(params_of(ladder.plan(m)).items())
        for ladder in enumerate_plans(choices, ctx, tally)
        for m in ladder.micro_batches
    }
    plain = tally.choices()
    for combo in itertools.islice(itertools.product(*(plain[k] for k in KNOBS)), 0, None, 97):
        params = dict(zip(KNOBS, combo, strict=True))
        plan, reason = suggest_plan(optuna.trial.FixedTrial(params), plain, ctx)
        assert (plan is None) == (reason is not None)
        if plan is not None:
            assert tuple(params_of(plan).items()) in legal
            assert plan_from_params(params_of(plan), ctx)[0] == plan


@pytest.mark.slow
def test_choices_hold_only_values_some_legal_plan_uses():
    model, cluster = load_model("70b"), make_cluster(num_gpus=16)
    choices = resolve_choices(load_space(), model, cluster)
    tally = Tally()
    ctx = PlanContext(model=model, cluster=cluster, global_batch=1024, seq_len=4096)
    ladders = list(enumerate_plans(choices, ctx, tally))
    assert sum(len(ladder.micro_batches) for ladder in ladders) == tally.num_legal
    plain = tally.choices()
    assert 5 in choices["pp"] and 5 not in plain["pp"]  # divides 80 layers, never 16 GPUs
    assert None in plain["hsdp_shard_size"] and 1 in plain["virtual_stages"]  # collapsed values stay
    assert tally.pruned["TP x PP x CP does not divide the GPU count"] > 0


def test_dp_pin_keeps_only_matching_layouts():
    model, cluster = load_model("70b"), make_cluster(num_gpus=16)
    choices = resolve_choices(load_space(), model, cluster, {"framework": "megatron"})
    ctx = PlanContext(model=model, cluster=cluster, global_batch=64, seq_len=4096, dp=2)
    plans = [ladder.plan(m) for ladder in enumerate_plans(choices, ctx) for m in ladder.micro_batches]
    assert plans and {p.dp for p in plans} == {2} and {str(p.framework) for p in plans} == {"megatron"}


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ([], ()),
        (["expert_fc1", "moe_act"], ("expert_fc1", "moe_act")),
        ("none", ()),
        ("expert_fc1", ("expert_fc1",)),
    ],
)
def test_offload_modules_candidates_read_as_the_space_file_and_optuna_write_them(tmp_path, value, parsed):
    from autotune.spacerules import plain

    space = _space(tmp_path, f"offload_modules: [{json.dumps(value)}]\n")
    assert space.knobs["offload_modules"] == (parsed,)
    stored = _space(tmp_path, f"offload_modules: [{json.dumps(plain(parsed))}]\n")  # Optuna's plain form
    assert stored.knobs["offload_modules"] == (parsed,)


def test_an_unpriced_offload_module_in_a_space_names_the_knob(tmp_path):
    with pytest.raises(ConfigError, match="knob 'offload_modules' takes lists of expert_fc1, moe_act"):
        _space(tmp_path, "offload_modules: [[core_attn]]\n")
