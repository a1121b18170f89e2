"""torchtitan.toml against torchtitan 0.2.2's own code (the ``test`` extra pins it; 0.3 dropped TOML): its
``ConfigManager`` and ``ParallelDims`` parse every emitted case, its model flavors are autotune's, its float8
converter takes the fp8 sections, and its train specs say which models pipeline. Importing torchtitan takes
seconds: all slow.
"""

from __future__ import annotations

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
