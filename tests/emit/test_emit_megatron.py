"""megatron_args.txt: parsed by an argparse that mirrors the Megatron-LM flags autotune emits (Megatron-LM is
not installable from PyPI as a library), then checked against Megatron's own rules from
``megatron/training/arguments.py::validate_args``: layers divisible by PP (and per-stage layers by the
layers per virtual stage), global batch divisible by micro-batch x DP, interleaving needs PP > 1,
selective recompute takes no method, GQA groups divide the heads, CPU offload rides on the
precision-aware distributed optimizer, and the model shape matches the ModelSpec."""

from __future__ import annotations

import argparse
import shlex

import pytest
from emit_cases import CASES
from megatron_flags import check_definition, check_megatron_rules, megatron_parser

from autotune.catalog import make_cluster
from autotune.emit import megatron_args, megatron_unsupported
from autotune.emit.megatron import megatron_args_text, megatron_env
from autotune.emit.megatronmodel import megatron_model_unsupported
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_args_follow_megatron_rules(name, emitted):
    plan, model, _ = CASES[name].build()
    path = emitted(name) / "megatron_args.txt"
    assert path.exists() == (not megatron_unsupported(plan) and not megatron_model_unsupported(model))
    if not path.exists():
        return
    a = megatron_parser().parse_args(shlex.split(path.read_text()))
    check_megatron_rules(a, plan.world_size)
    check_definition(a, model)
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size) == (
        plan.tp,
        plan.pp,
        plan.cp,
    )
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == (
        plan.micro_batch,
        plan.global_batch,
        plan.seq_len,
    )
    per_stage = model.num_layers // plan.pp
    if a.pipeline_model_parallel_layout:  # its chunks: PP x virtual stages
        assert a.pipeline_model_parallel_layout.count("|") + 1 == plan.pp * plan.virtual_stages
    else:
        assert per_stage // (a.num_layers_per_virtual_pipeline_stage or per_stage) == plan.virtual_stages
    assert (a.num_layers, a.hidden_size, a.num_attention_heads, a.ffn_hidden_size) == (
        model.num_layers,
        model.hidden_size,
        model.num_heads,
        model.ffn_hidden_size,
    )
    assert (a.num_query_groups or a.num_attention_heads) == model.num_kv_heads
    assert a.swiglu == model.gated_mlp and a.disable_bias_linear == (not model.bias)
    assert a.sequence_parallel == plan.sequence_parallel
    assert a.use_distributed_optimizer == (str(plan.sharding) == "zero1")
    assert (a.recompute_granularity or "none") == str(plan.recompute)
    assert (a.num_experts or 0, a.moe_router_topk or 0) == (model.num_experts, model.experts_per_token)
    assert (a.expert_model_parallel_size or 1, a.expert_tensor_parallel_size or 1) == (plan.ep, plan.etp)
    assert a.multi_latent_attention == model.uses_mla
    assert a.overlap_moe_expert_parallel_comm == a.delay_wgrad_compute == plan.moe_a2a_overlap
    assert (a.mtp_num_layers or 0) == model.mtp_layers
    assert tuple(a.recompute_modules or ()) == plan.recompute_modules
    assert a.fine_grained_activation_offloading == bool(plan.offload_modules)
    assert tuple(a.offload_modules or ()) == plan.offload_modules
    if model.is_moe:
        flex = str(plan.moe_dispatcher) not in ("alltoall", "allgather")
        assert (a.moe_token_dispatcher_type, a.moe_flex_dispatcher_backend) == (
            ("flex", str(plan.moe_dispatcher)) if flex else (str(plan.moe_dispatcher), None)
        )
    assert a.attention_output_gate == model.attention_output_gate
    if model.num_linear_layers:  # Megatron's get_linear_attention_pattern: softmax on every N-th layer
        assert a.experimental_attention_variant == "gated_delta_net"
        linear = [(i + 1) % a.linear_attention_freq != 0 for i in range(model.num_layers)]
        assert sum(linear) == model.num_linear_layers
        heads = (
            a.linear_num_key_heads,
            a.linear_num_value_heads,
            a.linear_key_head_dim,
            a.linear_value_head_dim,
        )
        assert heads == (
            model.linear_key_heads,
            model.linear_value_heads,
            model.linear_key_head_dim,
            model.linear_value_head_dim,
        )
    if model.layer_pattern:  # pretrain_mamba.py: the pattern places every layer, its E the MoE ones
        assert a.is_hybrid_model and a.hybrid_override_pattern == model.layer_pattern
        assert a.spec == ["megatron.core.models.mamba.mamba_layer_specs", "mamba_stack_spec"]
        assert (a.mamba_num_heads, a.mamba_head_dim, a.mamba_state_dim, a.mamba_num_groups) == (
            model.mamba_heads,
            model.mamba_head_dim,
            model.mamba_state_dim,
            model.mamba_groups,
        )
        assert a.position_embedding_type == "none" and a.squared_relu == (not model.gated_mlp)
        assert tuple(i for i, c in enumerate(a.hybrid_override_pattern) if c == "E") == model.moe_layers
    elif model.is_moe:
        freq = a.moe_layer_freq
        flags = [1] * model.num_layers if freq == 1 else freq
        assert tuple(i for i, f in enumerate(flags) if f) == model.moe_layers


def test_one_flag_per_line_and_nothing_to_quote(emitted):
    text = (emitted("megatron_interleaved") / "megatron_args.txt").read_text()
    for line in text.splitlines():
        assert line.startswith("--") and len(line.split()) <= 2 and shlex.split(line) == line.split()
    assert "--num-layers-per-virtual-pipeline-stage 4" in text.splitlines()  # 80 / (4 x 5)


def test_gpt_models_keep_learned_positions_and_biases(emitted):
    text = (emitted("gpt_megatron") / "megatron_args.txt").read_text()
    a = megatron_parser().parse_args(shlex.split(text))
    assert a.position_embedding_type == "learned_absolute" and a.normalization == "LayerNorm"
    assert not a.disable_bias_linear and not a.swiglu and not a.untie_embeddings_and_output_weights


def test_qkv_bias_models_keep_their_qkv_bias():
    """Qwen2 / GLM-4.5 put a bias on the QKV projection only: Megatron's ``--add-qkv-bias`` beside
    ``--disable-bias-linear`` (megatron/training/arguments.py), not a model without it."""
    from pathlib import Path

    from autotune.catalog import load_model

    config = Path(__file__).parents[2] / "autotune" / "data" / "hf_configs" / "qwen2.5-72b.json"
    plan = ParallelPlan(tp=8, pp=4, dp=2, global_batch=64, seq_len=4096, framework="megatron")
    a = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, load_model(str(config)))))
    assert a.disable_bias_linear and a.add_qkv_bias
    plain = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, load_model("70b"))))
    assert plain.disable_bias_linear and not plain.add_qkv_bias


def test_fp8_runs_on_bf16():
    plan = ParallelPlan(tp=2, dp=4, global_batch=64, seq_len=4096, precision="fp8", framework="megatron")
    flags = [f for group in megatron_args(plan, CASES["autotp"].build()[1]) for f in group]
    assert "--bf16" in flags and flags[flags.index("--fp8-format") + 1] == "hybrid"


def test_speed_knobs_turn_on_the_overlaps_the_model_assumes():
    model = CASES["autotp"].build()[1]
    plan = ParallelPlan(
        tp=2,
        dp=2,
        cp=2,
        global_batch=64,
        seq_len=4096,
        precision="fp8",
        framework="megatron",
        sharding="zero1",
        sequence_parallel=True,
        tp_comm_overlap=True,
        fp8_recipe="mx",
        cp_comm="a2a",
    )
    a = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, model)))
    check_megatron_rules(a, plan.world_size)
    assert a.tp_comm_overlap and a.overlap_grad_reduce and a.overlap_param_gather
    assert a.fp8_recipe == "mxfp8" and a.fp8_amax_history_len is None and a.cp_comm_type == ["a2a"]
    off = plan.replace(overlap_grad_reduce=False, overlap_param_gather=False, tp_comm_overlap=False)
    b = megatron_parser().parse_args(shlex.split(megatron_args_text(off, model)))
    assert not (b.tp_comm_overlap or b.overlap_grad_reduce or b.overlap_param_gather)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"sharding": "fsdp-full"}, "optimizer states only"),
        ({"pp": 2, "dp": 4, "schedule": "gpipe"}, "not GPipe"),
    ],
)
def test_plans_megatron_cannot_run_get_no_args(changes, reason):
    plan = ParallelPlan(**{**dict(dp=8, global_batch=64, seq_len=4096), **changes})
    assert any(reason in r for r in megatron_unsupported(plan))
    with pytest.raises(ConfigError, match="Megatron-LM cannot express"):
        megatron_args(plan, CASES["zero0"].build()[1])


def test_megatron_rules_are_checked_before_emitting():
    plan = ParallelPlan(
        pp=2,
        dp=2,
        global_batch=12,
        seq_len=2048,
        framework="megatron",
        schedule="interleaved",
        virtual_stages=3,
    )
    too_many = plan.replace(virtual_stages=18, global_batch=36)  # 36 chunks > 32 layers + 2
    with pytest.raises(ConfigError, match="cannot split 32 layers into PP x virtual stages = 2 x 18"):
        megatron_args(too_many, CASES["zero0"].build()[1])
    layout = megatron_args_text(plan, CASES["zero0"].build()[1])  # 32 + 2 = 34 over 6 chunks: a layout
    assert "--pipeline-model-parallel-layout Etttt|tttttt|tttttt|tttttt|tttttt|ttttL\n" in layout
    assert "--num-virtual-stages-per-pipeline-rank" not in layout
    uneven = plan.replace(schedule="1f1b", virtual_stages=1, pp=3, global_batch=12)
    assert "--account-for-loss-in-pipeline-split" in megatron_args_text(uneven, CASES["zero0"].build()[1])


def _moe_args(model: str, **changes) -> argparse.Namespace:
    """The Megatron flags of an EP-8 Megatron plan of ``model`` (with ``changes``), parsed by Megatron's
    argument names and checked against its rules."""
    from autotune.catalog import load_model
    from autotune.emit.megatron import megatron_args_text
    from autotune.plan import ParallelPlan

    plan = ParallelPlan(
        **{
            "dp": 8,
            "ep": 8,
            "global_batch": 64,
            "seq_len": 4096,
            "framework": "megatron",
            "sharding": "zero1",
        },
        **changes,
    )
    a = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, load_model(model))))
    check_megatron_rules(a, plan.world_size)
    return a


def test_flex_dispatcher_is_emitted_as_megatrons_flags():
    """A plan with ``moe_dispatcher`` deepep / hybridep runs Megatron's flex dispatcher with that backend."""
    a = _moe_args("qwen3-30b-a3b", moe_dispatcher="hybridep")
    assert (a.moe_token_dispatcher_type, a.moe_flex_dispatcher_backend) == ("flex", "hybridep")


def test_all_gather_dispatcher_is_emitted_as_megatrons():
    a = _moe_args("mixtral-8x7b", moe_dispatcher="allgather")
    assert (a.moe_token_dispatcher_type, a.moe_flex_dispatcher_backend) == ("allgather", None)


def test_capacity_factor_is_emitted_dropped_and_padded():
    """A plan with ``moe_capacity_factor`` runs Megatron's token dropping padded to capacity (the sync-free
    path the cost model prices); torchtitan has none and is not emitted."""
    from autotune.emit.torchtitan import torchtitan_unsupported
    from autotune.plan import ParallelPlan

    a = _moe_args("qwen3-30b-a3b", moe_capacity_factor=1.25)
    assert (a.moe_expert_capacity_factor, a.moe_pad_expert_input_to_capacity) == (1.25, True)
    dropless = _moe_args("qwen3-30b-a3b")
    assert (dropless.moe_expert_capacity_factor, dropless.moe_pad_expert_input_to_capacity) == (None, False)
    plan = ParallelPlan(dp=8, ep=8, global_batch=64, seq_len=4096, sharding="zero1", framework="deepspeed")
    assert any("dropless" in r for r in torchtitan_unsupported(plan.replace(moe_capacity_factor=1.0)))


def test_megatron_reduces_gradients_over_dp_x_cp():
    """Megatron's gradients and distributed optimizer span DP x CP, so DP 1 x CP 4 still reduces and gathers
    them, overlapped as priced; ``validate_args`` refuses ``--overlap-param-gather`` without
    ``--overlap-grad-reduce`` (which autotune left out at DP 1 before)."""
    model = CASES["autotp"].build()[1]
    plan = ParallelPlan(
        tp=2,
        cp=4,
        global_batch=64,
        seq_len=8192,
        framework="megatron",
        sharding="zero1",
        sequence_parallel=True,
    )
    a = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, model)))
    check_megatron_rules(a, plan.world_size)
    assert a.overlap_grad_reduce and a.overlap_param_gather and a.use_distributed_optimizer
    gather_only = plan.replace(overlap_grad_reduce=False)  # Megatron-Bridge's DDP config runs it; -LM refuses
    assert any("--overlap-param-gather without" in r for r in megatron_unsupported(gather_only))
    assert not megatron_unsupported(gather_only.replace(overlap_param_gather=False))


def test_megatron_fsdp_gets_its_required_flags_and_more_than_one_connection():
    """Megatron-FSDP's user guide requires ``--no-gradient-accumulation-fusion`` and ``--ckpt-format
    fsdp_dtensor`` (which ``validate_args`` asserts), and ``validate_args`` asserts
    CUDA_DEVICE_MAX_CONNECTIONS is not 1, TP or not; it always overlaps its DP collectives, so a plan that
    turns them off is refused."""
    model = CASES["autotp"].build()[1]
    plan = ParallelPlan(tp=2, dp=4, global_batch=64, seq_len=4096, framework="megatron", sharding="fsdp-full")
    plan = plan.replace(sequence_parallel=True)
    a = megatron_parser().parse_args(shlex.split(megatron_args_text(plan, model)))
    check_megatron_rules(a, plan.world_size)
    assert megatron_env(plan, make_cluster(num_gpus=8).gpu)["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    with pytest.raises(ValueError, match="Megatron-FSDP always overlaps its DP collectives"):
        plan.replace(overlap_param_gather=False)


def test_fine_grained_offload_sets_what_transformer_engine_2_10_asks():
    plan = ParallelPlan(dp=8, ep=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
    assert "NVTE_CPU_OFFLOAD_V1" not in megatron_env(plan)
    offloaded = plan.replace(offload_modules=("moe_act",))
    assert megatron_env(offloaded)["NVTE_CPU_OFFLOAD_V1"] == "1"
