"""Hybrid Mamba-2 models (Nemotron-H, Nemotron 3): what the pattern's single-sub-layer layers and the Mamba-2
mixer add to parameters, FLOPs, GEMMs, collectives and memory, and the plans Megatron cannot run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune import modelshape
from autotune.catalog import load_model, make_cluster, model_from_dict
from autotune.costmodel import estimate, flops, gemms
from autotune.costmodel.activations import LayerShape, kernels_for, norm_side_bytes
from autotune.costmodel.tpcomm import block_collectives
from autotune.emit.torchtitan import torchtitan_model_unsupported
from autotune.errors import ConfigError
from autotune.legalrules import latent_moe_broken
from autotune.plan import Framework, ParallelPlan, check_plan

CONFIGS = Path(__file__).resolve().parents[2] / "autotune" / "data" / "hf_configs"
NANO = CONFIGS / "nemotron-3-nano-30b-a3b.json"


@pytest.fixture(scope="module")
def nano():
    return load_model(str(NANO))


def _cfg(**changes):
    return {**json.loads(NANO.read_text()), **changes}


def test_nemotron_3_nano_reads_its_pattern_at_its_published_size(nano):
    """NVIDIA: 23 Mamba-2, 23 MoE and 6 attention layers, "30B total, 3.5B active" (Megatron-Bridge
    docs/models/nemotron/nemotron3-nano.md); the preset is the config."""
    assert dataclasses.asdict(load_model("nemotron-3-nano-30b-a3b")) == {
        **dataclasses.asdict(nano),
        "name": "nemotron-3-nano-30b-a3b",
    }
    pattern = nano.layer_pattern
    assert (pattern.count("M"), pattern.count("E"), pattern.count("*"), len(nano.moe_layers)) == (
        23,
        23,
        6,
        23,
    )
    assert (nano.num_layer_norms, nano.num_dense_mlp_layers, nano.gated_mlp) == (1, 0, False)
    assert 30.0 <= nano.total_params / 1e9 < 32.0
    assert nano.active_params / 1e9 == pytest.approx(3.5, rel=0.03)


def test_a_mamba_layer_has_megatrons_parameters():
    """``MambaMixer`` (megatron/core/ssm/mamba_mixer.py): in_proj h x (2 d_in + 2 G N + H), conv1d over
    d_in + 2 G N channels of width k with a bias, dt_bias / A_log / D per head, the gated norm's d_in weights,
    out_proj d_in x h; and the layer's one pre-norm of h."""
    h, heads, p, n, g, k = 256, 8, 32, 16, 2, 4
    cfg = _cfg(
        hidden_size=h,
        num_hidden_layers=2,
        hybrid_override_pattern="M*",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        mamba_num_heads=heads,
        mamba_head_dim=p,
        ssm_state_size=n,
        n_groups=g,
        conv_kernel=k,
        n_routed_experts=None,
        num_experts_per_tok=None,
        vocab_size=1000,
    )
    model = model_from_dict(cfg, name="tiny-hybrid")
    d_in, gn = heads * p, g * n
    mamba = h * (2 * d_in + 2 * gn + heads) + (d_in + 2 * gn) * (k + 1) + 3 * heads + d_in + d_in * h
    attention = 2 * h * 4 * 64 + 2 * h * 2 * 64
    embeddings = 2 * 1000 * h
    assert model.num_params == mamba + attention + 2 * h + embeddings + h  # two pre-norms, the final norm


def test_ssd_flops_follow_the_chunked_algorithm(nano):
    """Per token: ``2 Q N G + H (2 Q P + 4 N P)`` with Q = 128 (the docstring's SSD steps), times the
    Mamba-2 share of the layers; counted in the model's FLOPs (forward + backward) and in full recompute."""
    q, n, p = 128, 128, 64
    per_token = 2 * q * n * 8 + 64 * (2 * q * p + 4 * n * p)
    assert flops.linear_attention_flops_per_token(nano) == pytest.approx(per_token * 23 / 52)
    without = dataclasses.replace(nano, mamba_heads=0)
    gap = flops.model_flops_per_token(nano, 8192) - flops.model_flops_per_token(without, 8192)
    gemm_gap = 3 * 52 * (flops.layer_gemm_flops_per_token(nano) - flops.layer_gemm_flops_per_token(without))
    assert gap == pytest.approx(gemm_gap + 3 * 52 * per_token * 23 / 52)


def test_attention_work_is_only_the_attention_layers(nano):
    full = dataclasses.replace(nano, layer_pattern="*" * 52, moe_layers=())
    ratio = flops.attention_flops_per_token(nano, 8192) / flops.attention_flops_per_token(full, 8192)
    assert ratio == pytest.approx(6 / 52)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_block_gemms_sum_to_the_mean_layers_gemm_flops(nano, tp):
    """The GEMM list of the mean layer (attention, Mamba-2 in_proj / out_proj and the MoE router and shared
    expert, each by its share of the pattern) holds the FLOPs ``flops.layer_gemm_flops_per_token`` counts;
    the routed experts' rows are tile-rounded, so they are left out of the comparison."""
    plan = ParallelPlan(tp=tp, dp=8 // tp, global_batch=64, seq_len=8192, sequence_parallel=tp > 1)
    tokens = 8192.0
    shapes = gemms.block_gemms(nano, plan, tokens, fused=True)[:-2]
    routed = 6 * 2 * nano.hidden_size * nano.expert_ffn_hidden_size * 23 / 52
    expected = (flops.layer_gemm_flops_per_token(nano) - 2 * routed) * tokens / tp
    assert sum(g.flops for g in shapes) == pytest.approx(expected, rel=1e-9)


def test_a_hybrid_layer_is_one_sub_layer(nano):
    """One norm and residual add, one TP reduction each way: half a transformer block's."""
    plan = ParallelPlan(
        tp=2, dp=4, global_batch=64, seq_len=8192, sequence_parallel=True, framework="megatron"
    )
    assert block_collectives(nano, plan) == (1, 1)
    classic = load_model("qwen3-30b-a3b")
    assert block_collectives(classic, plan) == (2, 2)
    shape = LayerShape.of(nano, plan)
    kernels = kernels_for(plan)
    two = dataclasses.replace(shape, sublayers=2)
    assert norm_side_bytes(shape, 2, kernels) == pytest.approx(norm_side_bytes(two, 2, kernels) / 2)


def test_the_published_h100_layout_fits_and_runs_its_recompute_modules(nano):
    """Megatron-Bridge's Nano on 16 H100 (FP8, EP 8, micro-batch 1 x 8192, selective recompute of moe,
    layernorm, core_attn, moe_act): feasible, and the modules free memory and cost time."""
    base = dict(dp=16, ep=8, global_batch=1024, seq_len=8192, sharding="zero1", precision="fp8")
    plain = ParallelPlan(**base, framework="megatron", moe_dispatcher="hybridep")
    modules = plain.replace(
        recompute="selective", recompute_modules=("moe", "layernorm", "core_attn", "moe_act")
    )
    cluster = make_cluster(num_gpus=16)
    a, b = estimate(nano, cluster, plain), estimate(nano, cluster, modules)
    assert a.feasible and b.feasible
    assert b.memory.activations_bytes < a.memory.activations_bytes and b.step_time_s > a.step_time_s


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(tp=16, dp=1), "TP does not divide the Mamba B/C groups: TP 16, 8"),
        (dict(cp=2, dp=4), "context parallelism of Mamba layers"),
        (dict(recompute="full"), "MambaStack has no full recompute"),
        (dict(pp=2, dp=4, schedule="interleaved", virtual_stages=2, global_batch=64), "virtual pipeline"),
        (dict(pp=8, dp=1, global_batch=64), "PP does not divide a hybrid pattern's layers"),
        (dict(framework="deepspeed", tp=2, dp=4, sharding="zero1"), "DeepSpeed AutoTP of Mamba layers"),
        (dict(framework="fsdp", recompute="selective"), "op-level selective recompute of Mamba layers"),
    ],
)
def test_plans_megatron_cannot_run_are_refused_with_the_fix(nano, changes, message):
    fields = dict(dp=8, global_batch=32, seq_len=8192, framework="megatron")
    plan = ParallelPlan(**{**fields, **changes})
    errors = check_plan(plan, nano, make_cluster(num_gpus=plan.world_size))
    assert any(message in e for e in errors), errors


def test_megatron_selective_recompute_with_modules_is_priced(nano):
    plan = ParallelPlan(
        dp=8,
        ep=8,
        global_batch=32,
        seq_len=8192,
        framework="megatron",
        recompute="selective",
        recompute_modules=("moe_act", "layernorm"),
    )
    assert not check_plan(plan, nano, make_cluster(num_gpus=8))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            dict(hybrid_override_pattern="MEM*"),
            "the hybrid pattern has 4 layers but 'num_hidden_layers' is 52",
        ),
        (dict(hybrid_override_pattern="MEX" * 17 + "M"), r"string of M \(Mamba-2\)"),
        (dict(hybrid_override_pattern="M*" * 26), "the expert keys need MoE layers"),
        (dict(chunk_size=256), "'chunk_size' must be 128"),
        (dict(use_conv_bias=False), "use_conv_bias"),
        (dict(mamba_proj_bias=True), "mamba_proj_bias"),
        (dict(n_groups=3), "not a multiple of 'n_groups'"),
        (dict(layers_block_type=["mamba", "conv"], hybrid_override_pattern=None), "layers_block_type"),
    ],
)
def test_nemotron_h_values_the_pricing_does_not_cover_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message) as err:
        model_from_dict(_cfg(**changes), name="nano")
    assert "\n" not in str(err.value)


def test_layers_block_type_is_the_same_pattern(nano):
    kinds = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    cfg = _cfg(hybrid_override_pattern=None, layers_block_type=[kinds[c] for c in nano.layer_pattern])
    assert model_from_dict(cfg, name="nano").layer_pattern == nano.layer_pattern


def test_ssd_time_is_priced_at_the_slower_of_its_flops_and_bytes(nano):
    """Not measured (the docstring): the scan's bytes bind at these shapes."""
    per_token_bytes = flops.linear_attention_bytes_per_token(nano)
    d_in, gn = modelshape.mamba_widths(nano)
    assert per_token_bytes > 2 * 2 * (d_in + 2 * gn) * 23 / 52  # at least its inputs, read twice


@pytest.fixture(scope="module")
def super_():
    return load_model("nemotron-3-super-120b-a12b")


def test_nemotron_3_super_reads_its_latent_moe_at_its_published_size(super_):
    """NVIDIA: "12B active parameters and 120B parameters in total" (Megatron-Bridge
    docs/models/nemotron/nemotron3-super.md); 512 experts of 2688 at the latent width 1024, top-22."""
    assert super_.moe_latent_size == 1024 and super_.expert_width == 1024
    assert super_.total_params / 1e9 == pytest.approx(120, rel=0.02)
    active = (super_.active_params - super_.vocab_size * super_.hidden_size) / 1e9
    assert 11.5 <= active < 13.0


def test_latent_moe_experts_and_dispatch_run_at_the_latent_width(super_):
    """The routed experts' GEMMs take latent-wide rows, the dispatch moves latent-wide copies, and the two
    projections (h x latent each, on the sequence shard) are GEMMs of the mean layer."""
    full = dataclasses.replace(super_, moe_latent_size=0)
    assert modelshape.routed_width_per_layer(super_) == pytest.approx(
        modelshape.routed_width_per_layer(full) * 1024 / 4096
    )
    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=8192, framework="megatron")
    shapes = gemms.block_gemms(super_, plan, 8192.0, fused=True)
    assert (shapes[-2].k, shapes[-1].n) == (1024, 1024)
    projections = [g for g in shapes if {g.n, g.k} == {1024, 4096}]
    assert len(projections) == 2
    per_layer = modelshape.latent_projection_params(super_)
    assert per_layer == 2 * 4096 * 1024
    assert modelshape.moe_mlp_params(super_) - modelshape.moe_mlp_params(full) == pytest.approx(
        per_layer + modelshape.routed_expert_params(super_) - modelshape.routed_expert_params(full)
    )


def test_latent_moe_runs_where_its_code_exists_and_is_emitted(super_):
    """Megatron-Core, and FSDP2 at TP 1 (NeMo AutoModel's published 64-H100 run); not with TP outside
    Megatron, and torchtitan has no model for it."""
    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=8192, framework="megatron", sharding="zero1")
    cluster = make_cluster(num_gpus=64, gpu="b300")
    assert not check_plan(plan, super_, cluster)
    fsdp = plan.replace(framework="fsdp", sharding="fsdp-full")
    assert not check_plan(fsdp, super_, cluster)
    tp = fsdp.replace(tp=2, dp=32, ep=32)
    assert any(
        e.startswith("LatentMoE with TP runs in Megatron-Core only") for e in check_plan(tp, super_, cluster)
    )
    assert latent_moe_broken(1024, Framework.DEEPSPEED, 1).startswith(
        "LatentMoE runs in Megatron-Core and FSDP2"
    )
    assert torchtitan_model_unsupported(dataclasses.replace(super_, layer_pattern=""))[0].endswith(
        "has no LatentMoE model (its models: llama3, qwen3, deepseek_v3, ...)"
    )
    from autotune.emit.megatron import megatron_args_text

    assert "--moe-latent-size 1024" in megatron_args_text(plan, super_).splitlines()


def test_autotunes_trainer_refuses_a_model_it_cannot_build_and_the_summary_says_so(super_, tmp_path):
    """The built-in trial model has no Mamba-2 or LatentMoE layers: the worker refuses the plan in one line
    (as ``autotune search`` refuses real trials of it), and the emitted summary starts from your script."""
    from autotune.emit import emit_all
    from autotune.errors import TrialError
    from autotune.trials.config import TrialConfig
    from autotune.trials.worker import make_trainer

    plan = ParallelPlan(dp=64, ep=64, global_batch=512, seq_len=4096, sharding="fsdp-full")
    with pytest.raises(TrialError, match="the built-in trial model has no a hybrid pattern of Mamba-2"):
        make_trainer(plan, TrialConfig(model=super_, device="cpu"), device=None)
    emit_all(plan, super_, make_cluster(num_gpus=64, gpu="h100-sxm"), None, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "Priced for **fsdp**: start with launch_torchrun.sh (your train.py)." in summary
