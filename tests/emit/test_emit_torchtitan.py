"""torchtitan.toml: checked against torchtitan v0.2.2, its last TOML release.

Always: ``tomllib`` parses the file; every key is a field of v0.2.2's ``JobConfig`` (pinned below from
``torchtitan/config/job_config.py`` at tag v0.2.2, whose ``ConfigManager`` rejects unknown fields) with an
allowed value; the degrees multiply to the world size (``ParallelDims``); the batch passes the trainer's
``global % (local x DP) == 0``; the pipeline split follows ``pipeline_llm``'s stage count and the schedule
name resolves with torch's own ``get_schedule_class``.
torchtitan's own code runs on it in ``test_emit_torchtitan_itself.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
from emit_cases import CASES
from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

from autotune.catalog import load_model
from autotune.emit import to_torchtitan_config, torchtitan_unsupported
from autotune.emit.torchtitan import (
    dumps_toml,
    torchtitan_flavor,
    torchtitan_model,
    torchtitan_model_unsupported,
)
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan

tomllib = pytest.importorskip("tomllib")

V0_2_2_FIELDS = {
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion"},
    "training": {
        "dataset",
        "dataset_path",
        "local_batch_size",
        "global_batch_size",
        "seq_len",
        "max_norm",
        "steps",
        "enable_cpu_offload",
        "dtype",
        "mixed_precision_param",
        "mixed_precision_reduce",
        "gc_freq",
        "gc_debug",
        "dataloader",
    },
    "parallelism": {
        "data_parallel_replicate_degree",
        "data_parallel_shard_degree",
        "fsdp_reshard_after_forward",
        "tensor_parallel_degree",
        "disable_loss_parallel",
        "enable_async_tensor_parallel",
        "pipeline_parallel_degree",
        "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv",
        "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap",
        "context_parallel_degree",
        "context_parallel_load_balancer",
        "context_parallel_rotate_method",
        "expert_parallel_degree",
        "expert_tensor_parallel_degree",
        "expert_parallel_comm_backend",
    },
    "activation_checkpoint": {
        "mode",
        "selective_ac_option",
        "per_op_sac_force_recompute_mm_shapes_by_fqns",
        "early_stop",
        "memory_budget",
        "visualize_memory_budget_pareto",
        "preserve_rng_state",
        "determinism_check",
        "debug",
    },
    "quantize.linear.float8": {
        "enable_fsdp_float8_all_gather",
        "precompute_float8_dynamic_scale_for_fsdp",
        "recipe_name",
        "filter_fqns",
        "emulate",
    },
    "quantize.linear.mx": {"mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"},
    "compile": {"enable", "components", "backend"},
}
V0_2_2_LITERALS = {
    ("parallelism", "fsdp_reshard_after_forward"): {"default", "always", "never"},
    ("training", "mixed_precision_param"): {"bfloat16", "float32"},
    ("training", "mixed_precision_reduce"): {"float32"},
    ("activation_checkpoint", "mode"): {"selective", "full", "memory_budget", "none"},
    ("quantize.linear.float8", "recipe_name"): {"tensorwise", "rowwise", "rowwise_with_gw_hp"},
    ("parallelism", "context_parallel_rotate_method"): {"allgather", "alltoall"},
    ("parallelism", "expert_parallel_comm_backend"): {"standard", "deepep"},
}
CONVERTERS = {
    "quantize.linear.float8",
    "quantize.grouped_mm.float8",
    "quantize.linear.mx",
    "quantize.grouped_mm.mx",
}


def _flatten(data: dict, prefix: str = "") -> dict[str, dict]:
    """``{"quantize": {"linear": {"float8": {...}}}}`` -> ``{"quantize.linear.float8": {...}}``."""
    out: dict[str, dict] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if name in V0_2_2_FIELDS:
            out[name] = value
        else:
            out.update(_flatten(value, f"{name}."))
    return out


def _cases():
    return [n for n in CASES if not torchtitan_unsupported(CASES[n].build()[0])]


@pytest.mark.parametrize("name", list(CASES))
def test_emitted_iff_torchtitan_can_run_it(name, emitted):
    plan = CASES[name].build()[0]
    assert (emitted(name) / "torchtitan.toml").exists() == (not torchtitan_unsupported(plan))


@pytest.mark.parametrize("name", _cases())
def test_keys_and_values_are_torchtitan_v0_2_2(name, emitted):
    sections = _flatten(tomllib.loads((emitted(name) / "torchtitan.toml").read_text()))
    for section, values in sections.items():
        assert set(values) <= V0_2_2_FIELDS[section], f"{section}: {set(values) - V0_2_2_FIELDS[section]}"
        for key, value in values.items():
            if (section, key) in V0_2_2_LITERALS:
                assert value in V0_2_2_LITERALS[section, key], f"{section}.{key} = {value!r}"
    assert set(sections.get("model", {}).get("converters", [])) <= CONVERTERS
    float8 = sections.get("quantize.linear.float8", {})  # Float8LinearConverter (float8.py) asserts it
    assert not ("recipe_name" in float8 and float8.get("enable_fsdp_float8_all_gather")), float8


@pytest.mark.parametrize("name", _cases())
def test_layout_batch_and_pipeline_follow_torchtitan_rules(name, emitted):
    plan, model, _ = CASES[name].build()
    doc = tomllib.loads((emitted(name) / "torchtitan.toml").read_text())
    par, train = doc["parallelism"], doc["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    degrees = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree")
    assert dp * math.prod(par[d] for d in degrees) == plan.world_size
    if par["data_parallel_replicate_degree"] > 1 and par["data_parallel_shard_degree"] == 1:
        assert dp == plan.world_size  # torchtitan: "DDP has not supported > 1D parallelism"
    assert train["global_batch_size"] % (train["local_batch_size"] * dp) == 0
    accumulation = train["global_batch_size"] // (train["local_batch_size"] * dp)
    if plan.pp == 1:
        assert accumulation == plan.num_microbatches
        return
    schedule = get_schedule_class(par["pipeline_parallel_schedule"])  # torch's own registry
    per_stage = par["pipeline_parallel_layers_per_stage"]
    stages = math.ceil(
        (
            model.num_layers
            + par["pipeline_parallel_first_stage_less_layers"]
            + par["pipeline_parallel_last_stage_less_layers"]
        )
        / per_stage
    )  # pipeline_llm
    assert stages % plan.pp == 0
    assert (stages // plan.pp == 1) == issubclass(schedule, PipelineScheduleSingle)
    assert stages == plan.pp * plan.virtual_stages and per_stage * stages == model.num_layers
    assert train["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0
    assert (
        accumulation * train["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
        == plan.num_microbatches
    )


def test_interleaved_pipeline_maps_to_interleaved1f1b():
    plan = ParallelPlan(
        pp=4,
        dp=2,
        global_batch=64,
        seq_len=2048,
        schedule="interleaved",
        virtual_stages=2,
        sharding="fsdp-full",
    )
    par = to_torchtitan_config(plan, CASES["zero0"].build()[1])["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_layers_per_stage"] == 4  # 32 layers / (4 x 2)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"sharding": "zero1", "framework": "deepspeed"}, "optimizer-only"),
        ({"sharding": "none", "tp": 2, "dp": 4}, "DDP"),
        ({"offload": True, "sharding": "fsdp-full"}, "parameters and gradients too"),
        ({"precision": "fp16"}, "fp16"),
        ({"ep": 8, "moe_dispatcher": "hybridep", "framework": "megatron", "sharding": "zero1"}, "hybridep"),
        (
            {"tp": 2, "dp": 4, "precision": "fp8", "fp8_recipe": "mx", "compile": True},
            "MXFP8 does not run TP",
        ),
    ],
)
def test_plans_torchtitan_cannot_run_get_no_config(changes, reason):
    plan = ParallelPlan(**{**dict(dp=8, global_batch=64, seq_len=4096), **changes})
    assert any(reason in r for r in torchtitan_unsupported(plan))
    with pytest.raises(ConfigError, match="torchtitan cannot express"):
        to_torchtitan_config(plan, CASES["zero0"].build()[1])


def test_deepseek_v3_float8_tensorwise_with_tp_is_not_written():
    """``parallelize_deepseekv3`` (0.2.2) raises "float8 tensorwise TP is not tested for deepseekv3"."""
    plan = ParallelPlan(
        tp=2, dp=8, ep=8, global_batch=64, seq_len=4096, sharding="fsdp-full", precision="fp8"
    )
    deepseek = load_model("deepseek-v3")
    assert "float8 tensorwise with TP" in torchtitan_model_unsupported(deepseek, plan)[0]
    assert not torchtitan_model_unsupported(deepseek, plan.replace(fp8_recipe="rowwise"))


def test_deepseek_v3_with_context_parallelism_is_not_written():
    """Every deepseek_v3 flavor of 0.2.2 runs FlexAttention, and its model args raise "Context Parallel only
    supports SDPA attention" at CP > 1 (benchmarks/torchtitan_validate_sampled.py found it); qwen3 is SDPA."""
    plan = ParallelPlan(cp=2, dp=16, ep=8, global_batch=64, seq_len=4096, sharding="fsdp-full")
    assert "FlexAttention" in torchtitan_model_unsupported(load_model("deepseek-v3"), plan)[0]
    assert not torchtitan_model_unsupported(load_model("deepseek-v3"), plan.replace(cp=1, dp=32))
    assert not torchtitan_model_unsupported(load_model("qwen3-30b-a3b"), plan)


def test_an_unsharded_plan_with_context_parallelism_is_not_written():
    """torchtitan applies FSDP on its ``dp_shard x cp`` mesh whenever CP > 1, so an unsharded TP x CP plan
    runs with its states halved: not the plan that was priced (benchmarks/torchtitan_validate_sampled.py
    counted rank 0's parameters: half the model's)."""
    plan = ParallelPlan(tp=4, cp=2, global_batch=64, seq_len=8192)
    assert "shards the model states over CP" in torchtitan_unsupported(plan)[0]
    assert not torchtitan_unsupported(plan.replace(cp=1, tp=8))


def test_catalog_llama3_models_get_their_flavor(emitted):
    assert [torchtitan_flavor(load_model(m)) for m in ("llama3-8b", "llama3-70b", "llama3-405b", "7b")] == [
        "8B",
        "70B",
        "405B",
        None,
    ]
    assert 'name = "llama3"' in (emitted("hsdp") / "torchtitan.toml").read_text()


def test_speed_knobs_are_written_as_torchtitan_keys():
    """compile, async TP, the float8 recipe and the CP rotation reach the TOML (v0.2.2 keys and literals);
    rowwise scaling gets no fp8 FSDP all-gather (torchtitan supports it for tensorwise only, which is its
    converter's path without a recipe name)."""
    model = CASES["fsdp_full"].build()[1]
    plan = ParallelPlan(
        tp=2,
        dp=2,
        cp=2,
        global_batch=8,
        seq_len=1024,
        sharding="fsdp-full",
        compile=True,
        async_tp=True,
        sequence_parallel=True,
        precision="fp8",
        fp8_recipe="rowwise",
        cp_comm="allgather",
    )
    cfg = to_torchtitan_config(plan, model)
    sections = _flatten(tomllib.loads(dumps_toml(cfg)))
    for section, keys in sections.items():
        assert set(keys) <= V0_2_2_FIELDS[section], section
        for key, value in keys.items():
            if (section, key) in V0_2_2_LITERALS:
                assert value in V0_2_2_LITERALS[(section, key)]
    assert cfg["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert cfg["parallelism"]["enable_async_tensor_parallel"] is True
    assert cfg["parallelism"]["context_parallel_rotate_method"] == "allgather"
    assert cfg["quantize.linear.float8"] == {"recipe_name": "rowwise"}  # all-gathers in bf16
    tensorwise = to_torchtitan_config(plan.replace(fp8_recipe="tensorwise"), model)["quantize.linear.float8"]
    assert tensorwise == {
        "enable_fsdp_float8_all_gather": True,
        "precompute_float8_dynamic_scale_for_fsdp": True,
    }


def test_a_deepep_plan_sets_torchtitans_comm_backend():
    """torchtitan runs DeepEP for expert parallelism since v0.2.1 (``[parallelism]
    expert_parallel_comm_backend``, 36a4b6942), in its deepseek_v3 model (the only one whose MoE reads the
    key in 0.2.2) and with ETP 1 (``parallelize_deepseekv3`` raises otherwise): such a plan is emitted with
    it, an all-to-all one leaves torchtitan's default ("standard"); DeepEP on its qwen3 MoE is not emitted."""
    plan, qwen3, _ = CASES["qwen3_moe_fsdp_ep"].build()
    deepep, deepseek = plan.replace(moe_dispatcher="deepep"), load_model("deepseek-v3")
    assert not torchtitan_unsupported(deepep) and not torchtitan_model_unsupported(deepseek, deepep)
    cfg = to_torchtitan_config(deepep, deepseek)
    sections = _flatten(tomllib.loads(dumps_toml(cfg)))
    assert set(sections["parallelism"]) <= V0_2_2_FIELDS["parallelism"]
    assert cfg["parallelism"]["expert_parallel_comm_backend"] == "deepep"
    assert "expert_parallel_comm_backend" not in to_torchtitan_config(plan, deepseek)["parallelism"]
    assert "deepseek_v3 model only, not qwen3" in torchtitan_model_unsupported(qwen3, deepep)[0]
    with pytest.raises(ConfigError, match="deepseek_v3 model only"):
        to_torchtitan_config(deepep, qwen3)
    sliced = deepep.replace(tp=2, dp=8, etp=2, sequence_parallel=True)
    assert any("ETP 1 only" in r for r in torchtitan_unsupported(sliced))


def test_moe_presets_name_torchtitans_own_model_and_flavor():
    """torchtitan 0.2.2 trains DeepSeek-V3 as ``deepseek_v3`` (MLA) and Qwen3-MoE as ``qwen3``; a preset of a
    registered flavor's shape names it, another MoE shape names its family and its own name as flavor (and
    the summary says where to register it)."""
    for preset, expected in (
        ("deepseek-v3", ("deepseek_v3", "671B")),
        ("qwen3-30b-a3b", ("qwen3", "30B-A3B")),
        ("qwen3-235b-a22b", ("qwen3", "235B-A22B")),
        ("llama3-70b", ("llama3", "70B")),
    ):
        model = load_model(preset)
        assert (torchtitan_model(model), torchtitan_flavor(model)) == expected, preset
    mixtral = load_model("mixtral-8x7b")
    assert (torchtitan_model(mixtral), torchtitan_flavor(mixtral)) == ("qwen3", None)


def test_a_flavors_shape_with_another_definition_is_not_that_flavor():
    """A Llama 3 shape with another RoPE base (a long-context fine-tune) or a Qwen3-MoE shape without its
    Q/K norm would train as another model under the registered flavor: they get none."""
    llama, qwen = load_model("llama3-8b"), load_model("qwen3-30b-a3b")
    assert (torchtitan_flavor(llama), torchtitan_flavor(qwen)) == ("8B", "30B-A3B")
    longer = dataclasses.replace(llama.definition, rope=dataclasses.replace(llama.definition.rope, theta=4e6))
    assert torchtitan_flavor(dataclasses.replace(llama, definition=longer)) is None
    plain = dataclasses.replace(qwen, definition=dataclasses.replace(qwen.definition, qk_norm=""))
    assert torchtitan_flavor(plain) is None
