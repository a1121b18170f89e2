"""torchtitan.toml against torchtitan 0.2.2's own code (the ``test`` extra pins it; 0.3 dropped TOML): its
``ConfigManager`` and ``ParallelDims`` parse every emitted case, its model flavors are autotune's, its float8
converter takes the fp8 sections, and its train specs say which models pipeline. Importing torchtitan takes
seconds: all slow.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from emit_cases import CASES

from autotune.catalog import load_model
from autotune.emit import to_torchtitan_config, torchtitan_unsupported
from autotune.emit.torchtitan import (
    LLAMA3_FLAVORS,
    MOE_FLAVORS,
    dumps_toml,
    torchtitan_flavor,
    torchtitan_model,
    torchtitan_model_unsupported,
)
from autotune.plan import ParallelPlan

pytestmark = pytest.mark.slow


def _cases():
    return [n for n in CASES if not torchtitan_unsupported(CASES[n].build()[0])]


@pytest.mark.parametrize("name", _cases())
def test_torchtitan_itself_parses_it_when_installed(name, emitted):
    config = pytest.importorskip("torchtitan.config")
    if not hasattr(config, "ConfigManager") or not hasattr(config, "JobConfig"):
        pytest.skip("torchtitan >= 0.3 configures jobs in Python, not TOML")
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = CASES[name].build()[0]
    job = config.ConfigManager().parse_args(["--job.config_file", str(emitted(name) / "torchtitan.toml")])
    p = job.parallelism
    ParallelDims(
        dp_replicate=p.data_parallel_replicate_degree,
        dp_shard=p.data_parallel_shard_degree,
        cp=p.context_parallel_degree,
        tp=p.tensor_parallel_degree,
        pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree,
        etp=p.expert_tensor_parallel_degree,
        world_size=plan.world_size,
    )
    model = CASES[name].build()[1]
    assert job.model.name == torchtitan_model(model)  # alone, the fragment no longer loads the debug model
    assert job.model.flavor == (torchtitan_flavor(model) or model.name)


def test_llama3_flavors_are_torchtitans():
    """Each flavor's shape, FFN width as torchtitan's FeedForward rounds it, built on the meta device."""
    import torch

    llama3 = pytest.importorskip("torchtitan.models.llama3")
    for flavor, (dim, layers, heads, kv_heads, ffn, vocab) in LLAMA3_FLAVORS.items():
        args = llama3.llama3_args[flavor]
        with torch.device("meta"):
            block = llama3.Transformer(args).layers["0"]
        assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (
            dim,
            layers,
            heads,
            kv_heads,
            vocab,
        ), flavor
        assert block.feed_forward.w1.out_features == ffn, flavor


def test_moe_flavors_are_torchtitans():
    """Each registered MoE flavor's shape as torchtitan's own model args give it."""
    ds = pytest.importorskip("torchtitan.models.deepseek_v3")
    qwen3 = pytest.importorskip("torchtitan.models.qwen3")
    registries = {"deepseek_v3": ds.deepseekv3_args, "qwen3": qwen3.qwen3_args}
    for (name, flavor), dims in MOE_FLAVORS.items():
        dim, layers, heads, kv_heads, expert_ffn, experts, top_k, vocab = dims
        args = registries[name][flavor]
        kv = getattr(args, "n_kv_heads", None) or args.n_heads
        shape = (args.dim, args.n_layers, args.n_heads, kv, args.moe_inter_dim)
        assert shape == (dim, layers, heads, kv_heads, expert_ffn), (name, flavor)
        assert (args.moe_args.num_experts, args.moe_args.top_k, args.vocab_size) == (experts, top_k, vocab)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchtitans_float8_converter_takes_the_emitted_section(recipe, tmp_path):
    """``Float8LinearConverter`` (its capability check patched: no GPU here) on the emitted TOML of a
    sharded fp8 plan: it asserts that a ``recipe_name`` comes without the fp8 FSDP all-gather, which autotune
    wrote for tensorwise before."""
    from torchtitan.components.quantization import float8
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = ParallelPlan(dp=8, global_batch=64, seq_len=4096, sharding="fsdp-full", precision="fp8")
    plan = plan.replace(fp8_recipe=recipe)
    path = tmp_path / "torchtitan.toml"
    path.write_text(dumps_toml(to_torchtitan_config(plan, load_model("llama3-8b"))))
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    dims = ParallelDims(dp_replicate=1, dp_shard=8, cp=1, tp=1, pp=1, ep=1, etp=1, world_size=8)
    with mock.patch.object(float8, "has_cuda_capability", return_value=True):
        converter = float8.Float8LinearConverter(job, dims)
    assert converter.precompute_scale == (recipe == "tensorwise")  # the fp8 all-gather's scales


def test_qwen3_has_no_pipelining_in_torchtitan_so_no_toml_is_written():
    from torchtitan.protocols.train_spec import get_train_spec

    plan, qwen3, _ = CASES["qwen3_moe_fsdp_ep"].build()
    piped = plan.replace(pp=2, dp=8, global_batch=128)
    assert get_train_spec("qwen3").pipelining_fn is None  # torchtitan's own train spec
    assert get_train_spec("deepseek_v3").pipelining_fn is not None
    assert "no pipelining" in torchtitan_model_unsupported(qwen3, piped)[0]
    assert not torchtitan_model_unsupported(load_model("deepseek-v3"), piped)


STARTS = {  # model, GPU, plan: one of each path torchtitan's start-up takes (not MXFP8: torchtitan 0.2.2
    # imports torchao's MXLinearConfig, which the pinned torchao 0.18 no longer has)
    "8B FSDP, compile, float8 tensorwise": (
        "llama3-8b",
        "h100-sxm",
        dict(dp=8, sharding="fsdp-full", compile=True, precision="fp8", fp8_recipe="tensorwise"),
    ),
    "8B TP2 x FSDP4, async TP, rowwise, op SAC": (
        "llama3-8b",
        "h100-sxm",
        dict(
            tp=2,
            dp=4,
            sharding="fsdp-full",
            sequence_parallel=True,
            compile=True,
            async_tp=True,
            precision="fp8",
            fp8_recipe="rowwise",
            recompute="selective",
        ),
    ),
    "70B HSDP x TP8 x CP4, all-gather rotation": (
        "llama3-70b",
        "h100-sxm",
        dict(tp=8, cp=4, dp=4, sharding="hsdp", hsdp_shard_size=2, cp_comm="allgather", seq_len=32768),
    ),
    "405B TP8 x PP8 x 8 virtual stages (uneven), FSDP2": (
        "llama3-405b",
        "h100-sxm",
        dict(tp=8, pp=8, dp=2, virtual_stages=8, schedule="interleaved", sharding="fsdp-full"),
    ),
    "Qwen3-30B-A3B EP8 x FSDP16": ("qwen3-30b-a3b", "h100-sxm", dict(dp=16, ep=8, sharding="fsdp-full")),
    "DeepSeek-V3 TP2 x HSDP 16 x 8 x EP16": (
        "deepseek-v3",
        "h100-sxm",
        dict(tp=2, dp=128, ep=16, sharding="hsdp", hsdp_shard_size=8, sequence_parallel=True),
    ),
    "DeepSeek-V3 PP4 x EP16 x FSDP64 (uneven), full AC, rowwise": (
        "deepseek-v3",
        "h100-sxm",
        dict(
            pp=4, dp=64, ep=16, sharding="fsdp-full", recompute="full", precision="fp8", fp8_recipe="rowwise"
        ),
    ),
}


def test_torchtitan_starts_the_emitted_plans_on_a_fake_process_group():
    """What ``Trainer.__init__`` does before a device (``benchmarks/torchtitan_validate_sampled.py``'s child:
    meshes, meta model, converters, batch asserts, parallelize or pipelining) on one plan of each path, and
    the parameters it leaves on rank 0 (its stages' shards) are those autotune's memory model holds there
    (HSDP experts replicated over ``dp_replicate``; DeepSeek-V3's dense first blocks on the first stage); and
    the harness refuses what torchtitan refuses (qwen3 with PP, deepseek_v3 with CP, written by hand)."""
    from benchmarks._sampled_plans import run_children
    from benchmarks.torchtitan_validate_sampled import _CHILD, rank0_params

    jobs, expected = {}, {}  # name: (TOML, world size, compute capability); autotune's rank-0 parameters
    for name, (model_name, gpu, fields) in STARTS.items():
        seq_len = fields.get("seq_len", 4096)
        rest = {k: v for k, v in fields.items() if k != "seq_len"}
        plan = ParallelPlan(global_batch=rest.get("dp", 1) * 16, seq_len=seq_len, **rest)
        model = load_model(model_name)
        assert not torchtitan_unsupported(plan) and not torchtitan_model_unsupported(model, plan), name
        arch = (10, 0) if gpu == "b200" else (9, 0)
        jobs[name] = (dumps_toml(to_torchtitan_config(plan, model)), plan.world_size, arch)
        expected[name] = rank0_params(model, plan)
    qwen3, world, arch = jobs["Qwen3-30B-A3B EP8 x FSDP16"]
    qwen3 = qwen3.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    jobs["qwen3 with PP 2"] = (qwen3.replace("shard_degree = 16", "shard_degree = 8"), world, arch)
    deepseek, world, arch = jobs["DeepSeek-V3 PP4 x EP16 x FSDP64 (uneven), full AC, rowwise"]
    deepseek = deepseek.replace("context_parallel_degree = 1", "context_parallel_degree = 2")
    jobs["deepseek_v3 with CP 2"] = (deepseek.replace("shard_degree = 64", "shard_degree = 32"), world, arch)
    batch = [{"id": i, "toml": t, "world": w, "arch": a} for i, (t, w, a) in enumerate(jobs.values())]
    results = run_children(_CHILD, batch, {**os.environ, "PYTHONWARNINGS": "ignore"}, procs=1)
    verdicts = {name: results[i] for i, name in enumerate(jobs)}
    assert [n for n in STARTS if verdicts[n]["ok"] is not True] == [], verdicts
    for name in STARTS:  # FSDP2 pads a shard to a whole row: within 0.2 %
        assert verdicts[name]["rank0_params"] == pytest.approx(expected[name], rel=2e-3), name
    # MLA's down projections and latent norms and the router whole on every TP rank: exact (-0.15 % before)
    tp2 = "DeepSeek-V3 TP2 x HSDP 16 x 8 x EP16"
    assert verdicts[tp2]["rank0_params"] == pytest.approx(expected[tp2], rel=1e-5)
    assert "does not support pipelining" in verdicts["qwen3 with PP 2"]["error"]
    assert "Context Parallel only supports SDPA" in verdicts["deepseek_v3 with CP 2"]["error"]
