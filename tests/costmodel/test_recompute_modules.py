"""Megatron's --recompute-modules as plan.recompute_modules: legality, memory it frees, emitted flag."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate
from autotune.costmodel.blocktime import block_times
from autotune.emit.megatron import megatron_args
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan


def _plan(**kw):
    base = {
        "global_batch": 256,
        "seq_len": 4096,
        "dp": 8,
        "ep": 8,
        "framework": "megatron",
        "sharding": "zero1",
        "recompute": "selective",
    }
    return ParallelPlan(**{**base, **kw})


def _activations(model, plan):
    return estimate(model, make_cluster(num_gpus=8, gpu="b200"), plan).memory.activations_bytes


def test_modules_need_selective_megatron_and_known_names():
    with pytest.raises(ConfigError, match="unknown module 'attn'"):
        _plan(recompute_modules=("attn",))
    with pytest.raises(ConfigError, match="needs --recompute selective"):
        _plan(recompute="full", recompute_modules=("moe",))
    with pytest.raises(ConfigError, match="list of module names"):
        ParallelPlan.from_dict({"global_batch": 8, "seq_len": 128, "recompute_modules": "moe"})
    reasons = check_plan(
        _plan(recompute_modules=("mla_up_proj",)), load_model("qwen3-30b-a3b"), make_cluster(num_gpus=8)
    )
    assert any("multi-latent attention" in r for r in reasons)


def test_modules_megatron_core_refuses_are_refused():
    """megatron-core 0.16.1's ``TransformerConfig`` raises for ``moe_act`` without grouped GEMM (which a
    dense model has not) and for ``moe_act`` / ``layernorm`` under fp8 delayed scaling
    (``tests/emit/test_emit_megatron_core.py`` asks megatron-core itself)."""
    dense = _plan(ep=1, recompute_modules=("core_attn", "moe_act"))
    reasons = check_plan(dense, load_model("llama3-8b"), make_cluster(num_gpus=8))
    assert reasons == [
        "recompute-modules moe_act needs MoE layers (Megatron's grouped GEMM); llama3-8b has none"
    ]
    current = _plan(precision="fp8", fp8_recipe="tensorwise", recompute_modules=("layernorm", "moe_act"))
    with pytest.raises(ConfigError, match="layernorm moe_act does not run with fp8 delayed scaling"):
        current.replace(fp8_recipe="delayed")


def test_each_moe_module_frees_more_than_the_one_inside_it():
    model = load_model("qwen3-30b-a3b")
    default = _activations(model, _plan())
    act = _activations(model, _plan(recompute_modules=("core_attn", "moe_act")))
    whole = _activations(model, _plan(recompute_modules=("core_attn", "moe")))
    norm = _activations(model, _plan(recompute_modules=("core_attn", "moe", "layernorm")))
    assert default > act > whole > norm
    # moe_act frees one expert-ffn-wide bf16 tensor per routed copy: top-8 x 768 x 2 B per token per layer
    # (PP 1: one micro-batch in flight; micro-batch 1 x 4096 tokens)
    per_token_layer = (default - act) / 4096 / model.num_layers
    assert per_token_layer == pytest.approx(8 * 768 * 2)


def test_mla_up_proj_frees_the_up_projected_qkv_of_deepseek_v3():
    model = load_model("deepseek-v3")
    plan = dict(pp=8, dp=32, ep=32, global_batch=4096, precision="fp8")
    cluster = make_cluster(num_gpus=256, gpu="b200")
    base = estimate(model, cluster, _plan(**plan)).memory.activations_bytes
    up = estimate(model, cluster, _plan(**plan, recompute_modules=("core_attn", "mla_up_proj")))
    assert up.memory.activations_bytes < base


def test_the_megatron_emitter_writes_the_modules():
    args = megatron_args(_plan(recompute_modules=("moe_act", "layernorm")), load_model("qwen3-30b-a3b"))
    assert ["--recompute-modules", "moe_act", "layernorm"] in args


def test_the_cli_takes_the_modules_and_refuses_them_without_selective(capsys):
    from autotune.cli import main

    base = [
        "estimate",
        "--model",
        "qwen3-30b-a3b",
        "--gpus",
        "8",
        "--gpu",
        "b200",
        "--dp",
        "8",
        "--ep",
        "8",
        "--framework",
        "megatron",
        "--global-batch",
        "64",
        "--seq-len",
        "4096",
        "--recompute-modules",
        "moe",
    ]
    assert main([*base, "--recompute", "selective"]) == 0
    assert "ac:selective[moe]" in capsys.readouterr().out
    assert main([*base, "--recompute", "full"]) != 0
    assert "needs --recompute selective" in capsys.readouterr().err


def test_recomputing_the_moe_layer_reruns_its_dispatch():
    from autotune.costmodel import moe

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16, gpu="h100-sxm")
    plain = moe.dispatch_s(model, cluster, _plan(dp=16, ep=16), 4096, 2)
    rerun = moe.dispatch_s(model, cluster, _plan(dp=16, ep=16, recompute_modules=("moe",)), 4096, 2)
    assert rerun == pytest.approx(plain * 6 / 4)


def test_only_the_listed_modules_rerun():
    """The attention core reruns only when listed (or by default); moe_act reruns the gated activation
    over every routed copy: read two expert-ffn halves, write one, 2 B each."""
    from autotune.costmodel import recompute_modules
    from autotune.costmodel.kernels import HBM_EFFICIENCY

    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=8, gpu="b200")
    core, tokens = 1e-3, 4096
    assert recompute_modules.rerun_s(model, cluster, _plan(), tokens, core) is None
    only_core = _plan(recompute_modules=("core_attn",))
    assert recompute_modules.rerun_s(model, cluster, only_core, tokens, core) == core
    act = recompute_modules.rerun_s(model, cluster, _plan(recompute_modules=("moe_act",)), tokens, core)
    hbm = cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY
    assert act == pytest.approx(tokens * 8 * 768 * 6 / hbm)
    whole = recompute_modules.rerun_s(model, cluster, _plan(recompute_modules=("moe",)), tokens, core)
    assert whole > 5 * act  # the router and expert GEMMs, the permutes and the activation


def test_mla_up_proj_reruns_the_up_projection_gemms():
    from autotune.costmodel import kernels, recompute_modules

    model, cluster = load_model("deepseek-v3"), make_cluster(num_gpus=256, gpu="b200")
    plan = _plan(pp=8, dp=32, ep=32, global_batch=4096, recompute_modules=("mla_up_proj",))
    q_up = kernels.gemm_s(cluster.gpu, "bf16", 4096, 128 * 192, 1536)
    kv_up = kernels.gemm_s(cluster.gpu, "bf16", 4096, 128 * (128 + 128), 512)
    assert recompute_modules.rerun_s(model, cluster, plan, 4096, 1.0) == pytest.approx(q_up + kv_up)


def test_modules_without_core_attn_do_not_rerun_the_core():
    """Qwen3-235B at 32k tokens: the recipe's ``layernorm moe`` recompute does not rerun the attention
    core, which is all the plain selective reruns (the step time, not only the memory, follows the list)."""
    model = load_model("qwen3-235b-a22b")
    cluster = make_cluster(num_gpus=64, gpu="h100-sxm")
    kw = dict(tp=4, cp=2, pp=8, dp=1, ep=8, seq_len=32768, global_batch=64, sequence_parallel=True)
    # per block: the busiest pipeline stage (which multiplies it) can change with the recompute time
    plain = block_times(model, cluster, _plan(**kw))
    mods = block_times(model, cluster, _plan(**kw, recompute_modules=("layernorm", "moe")))
    core = block_times(model, cluster, _plan(**kw, recompute_modules=("core_attn", "layernorm", "moe")))
    assert core.recompute_s - mods.recompute_s == pytest.approx(plain.recompute_s)
    assert mods.recompute_s > 0.0
