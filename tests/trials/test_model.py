"""Tier 0: the workload, trial.json, the DeepSpeed trial config, and what the GPU-side modules import."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.trials.config import TrialConfig
from autotune.trials.deepspeed_engine import trial_ds_config
from autotune.trials.model import Transformer, build_model, model_flops_per_token, synthetic_batch
from autotune.trials.parallelize import dp_degrees, split_stages


def test_init_is_deterministic_and_seeded(tiny):
    a, b = build_model(tiny, device="cpu", seed=3), build_model(tiny, device="cpu", seed=3)
    c = build_model(tiny, device="cpu", seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if pa.ndim == 2:
            assert not torch.equal(pa, pc), name


def test_pipeline_chunks_keep_the_reference_weights(tiny):
    """A stage gets exactly the parameters (names and values) the whole model has."""
    full = dict(build_model(tiny, device="cpu", seed=0).named_parameters())
    plan = ParallelPlan(pp=2, virtual_stages=2, schedule="interleaved", global_batch=4, seq_len=32)
    chunks = split_stages(build_model(tiny, device="cpu", seed=0), plan=plan, pp_rank=1)
    assert [stage for stage, _ in chunks] == [1, 3]
    names = set()
    for _, chunk in chunks:
        for name, p in chunk.named_parameters():
            assert torch.equal(p, full[name]), name
            names.add(name)
    assert {n.split(".")[1] for n in names if n.startswith("layers.")} == {"1", "3"}
    assert "lm_head.weight" in names and "embed_tokens.weight" not in names


def test_uneven_pipeline_chunks_follow_torchtitans_split(tiny):
    """4 layers over 3 stages: torchtitan's weighted split (stagesplit.py) gives 1, 2, 1 blocks."""
    plan = ParallelPlan(pp=3, global_batch=6, seq_len=32)
    chunks = [split_stages(build_model(tiny, device="cpu", seed=0), plan=plan, pp_rank=r) for r in range(3)]
    kept = [set(chunk[0][1].layers) for chunk in chunks]
    assert kept == [{"0"}, {"1", "2"}, {"3"}]


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"gated_mlp": False, "learned_positions": True, "bias": True},  # GPT-2 style
        {"tie_embeddings": True, "num_kv_heads": 2},  # GQA, tied
    ],
)
def test_parameter_count_matches_the_spec(variant):
    spec = dataclasses.replace(load_model("tiny"), **variant)
    model = Transformer(spec)
    assert sum(p.numel() for p in model.parameters()) == spec.num_params
    x, _ = synthetic_batch(spec, batch=2, seq_len=16, step=0, seed=0)
    assert model(x).shape == (2, 16, spec.vocab_size)


def test_synthetic_rows_are_slices_of_the_global_batch(tiny):
    full_x, full_y = synthetic_batch(tiny, batch=8, seq_len=16, step=5, seed=1)
    x, y = synthetic_batch(tiny, batch=8, seq_len=16, step=5, seed=1, rows=slice(4, 6))
    assert torch.equal(x, full_x[4:6]) and torch.equal(y, full_y[4:6])
    assert torch.equal(full_x[:, 1:], full_y[:, :-1])
    assert not torch.equal(full_x, synthetic_batch(tiny, batch=8, seq_len=16, step=6, seed=1)[0])


def test_model_flops_per_token_7b():
    """6N (+ causal attention) with N the matmul parameters: Llama-2-7B at 4096 tokens ~ 4.2e10 + 4.0e9."""
    spec = load_model("7b")
    n = spec.num_layers * spec.params_per_layer + spec.vocab_size * spec.hidden_size
    assert model_flops_per_token(spec, 4096) == pytest.approx(6 * n + 6 * 32 * 4096 * 4096)
    assert 6.5e9 < n < 6.8e9


def test_dp_degrees():
    plan = ParallelPlan(dp=4, global_batch=8, seq_len=8)
    assert dp_degrees(plan) == (4, 1)
    assert dp_degrees(plan.replace(sharding="fsdp-full")) == (1, 4)
    assert dp_degrees(plan.replace(sharding="hsdp", hsdp_shard_size=2)) == (2, 2)


def test_trial_config_round_trips_and_reads_the_emitted_form(tiny, tmp_path):
    cfg = TrialConfig(model=tiny, seed=7, lr=0.5, device="cpu", peak_flops_per_gpu=1e11)
    cfg.write(tmp_path / "trial.json")
    assert TrialConfig.read(tmp_path / "trial.json") == cfg
    assert TrialConfig.from_dict({"model": dataclasses.asdict(tiny)}) == TrialConfig(model=tiny)


def test_trial_ds_config_on_cpu():
    plan = ParallelPlan(dp=2, framework="deepspeed", global_batch=4, seq_len=8)
    cfg = trial_ds_config(plan.replace(sharding="zero3", offload=True), on_cpu=True)
    assert "bf16" not in cfg and cfg["gradient_clipping"] == 0.0
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["zero_force_ds_cpu_optimizer"] is False
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    tp = trial_ds_config(plan.replace(tp=2, dp=1), on_cpu=False)
    assert tp["tensor_parallel"] == {"autotp_size": 2, "preset_model": "llama"}
    assert tp["bf16"] == {"enabled": True}


@pytest.mark.slow
def test_gpu_side_modules_import_neither_deepspeed_nor_optuna():
    """The GPU validation machine has torch and yaml only."""
    code = (
        "import sys, autotune.trials.worker, autotune.trials.train, autotune.trials.deepspeed_engine, "
        "autotune.trials.runner, autotune.costmodel; "
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'deepspeed', 'optuna'}); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
