"""What defines a model without costing a step (``autotune.definition``): read from config.json, kept through
plan.json, written as Megatron-LM's flags, and refused in one line where Megatron has none."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from autotune.catalog import load_model, model_from_dict
from autotune.cli import main
from autotune.definition import Definition, Rope
from autotune.emit.megatron import megatron_args_text
from autotune.emit.megatronmodel import megatron_model_unsupported
from autotune.emit.planfile import model_to_config
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan

FIXTURES = "autotune/data/hf_configs"
LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}


def _with(model, **definition):
    return dataclasses.replace(model, definition=dataclasses.replace(model.definition, **definition))


def _definition(name: str) -> Definition:
    return load_model(name).definition


def _flags(model, **plan) -> dict[str, str | bool]:
    fields = dict(dp=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1") | plan
    if model.is_moe:
        fields["ep"] = 8
    lines = megatron_args_text(ParallelPlan(**fields), model).splitlines()
    return {flag: (value[0] if value else True) for flag, *value in map(shlex.split, lines)}


def test_published_configs_read_as_their_families_define_them():
    llama = load_model("llama3-405b").definition
    assert llama == Definition(
        rope=Rope(theta=500000.0, scaling="llama3", factor=8.0, original_positions=8192)
    )
    qwen = load_model("qwen3-30b-a3b").definition
    assert (qwen.rope.theta, qwen.qk_norm, qwen.norm_eps) == (1e6, "head", 1e-6)
    ds = load_model("deepseek-v3").definition.rope
    assert (ds.scaling, ds.factor, ds.original_positions, ds.mscale_all_dim) == ("yarn", 40.0, 4096, 1.0)
    assert _definition(f"{FIXTURES}/olmo-2-13b.json").qk_norm == "full"  # q_norm over all heads
    assert _definition(f"{FIXTURES}/llama4-scout-17b-16e.json").qk_norm == "l2"
    assert _definition(f"{FIXTURES}/glm-4.5.json").rope.fraction == 0.5
    assert _definition(f"{FIXTURES}/minimax-m2.json").rope.fraction == 0.5  # rotary_dim 64 of head_dim 128
    gpt3, gemma = load_model("gpt3-175b").definition, load_model("gemma2-27b").definition
    assert (gpt3.norm, gpt3.activation) == ("layer_norm", "gelu")
    assert (gemma.norm, gemma.activation) == ("rms_norm_1p", "gelu_tanh")  # (1 + w) RMSNorm, GeGLU
    assert _definition("nemotron-3-nano-30b-a3b").activation == "relu2"
    assert _definition(f"{FIXTURES}/command-r.json").norm == "layer_norm"
    nemotron4 = load_model(f"{FIXTURES}/nemotron-4-340b.json")  # nvidia/Nemotron-4-340B-Base: "340B"
    d = nemotron4.definition
    assert (d.norm, d.activation, d.rope.fraction, nemotron4.gated_mlp) == (
        "layer_norm_1p",
        "relu2",
        0.5,
        False,
    )
    assert nemotron4.num_params / 1e9 == pytest.approx(341.0, abs=0.1)


def test_other_spellings_of_the_same_settings():
    new_style = model_from_dict(
        LLAMA | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, name="x"
    )
    neox = model_from_dict(LLAMA | {"rotary_emb_base": 500000, "rotary_pct": 0.25}, name="x")
    a, b = new_style.definition.rope, neox.definition.rope
    assert a.theta == b.theta == 500000.0 and b.fraction == 0.25
    old_key = model_from_dict(LLAMA | {"rope_scaling": {"type": "linear", "factor": 2.0}}, name="x")
    assert (old_key.definition.rope.scaling, old_key.definition.rope.factor) == ("linear", 2.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"rope_theta": -1}, "key 'rope_theta' must be a positive number, got -1"),
        ({"rope_theta": "big"}, "key 'rope_theta' must be a positive number"),
        ({"partial_rotary_factor": 1.5}, "key 'partial_rotary_factor' rotates 1.5 of each head"),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 0}},
            "key 'rope_scaling.factor' must be a positive",
        ),
        ({"rope_scaling": "yarn"}, "key 'rope_scaling' must be a mapping or null"),
        ({"rms_norm_eps": 2}, "key 'rms_norm_eps' must be a number in (0, 1), got 2"),
        ({"norm_type": "batch_norm"}, "key 'norm_type' must be one of rms_norm, layer_norm"),
        (
            {"num_local_experts": 8, "num_experts_per_tok": 2, "n_group": "eight"},
            "key 'n_group' must be a positive",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key(extra, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        model_from_dict(LLAMA | extra, name="cfg.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("cfg.json: ")


@pytest.mark.parametrize(
    "name",
    ["llama3-405b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-next-80b-a3b", f"{FIXTURES}/olmo-2-13b.json"],
)
def test_plan_json_keeps_them(name):
    model = load_model(name)
    assert model_from_dict(model_to_config(model), name=model.name) == model


def test_megatron_flags_build_the_model_the_config_describes():
    assert _flags(load_model("70b")).keys().isdisjoint({"--rotary-base", "--qk-layernorm", "--norm-epsilon"})
    llama = _flags(load_model("llama3-405b"), tp=8, dp=2)
    assert (llama["--rotary-base"], llama["--use-rope-scaling"], llama["--rope-scaling-factor"]) == (
        "500000",
        True,
        "8",
    )
    qwen = _flags(load_model("qwen3-30b-a3b"))
    assert (qwen["--rotary-base"], qwen["--qk-layernorm"], qwen["--norm-epsilon"]) == (
        "1000000",
        True,
        "1e-06",
    )
    ds = _flags(load_model("deepseek-v3"), dp=64, global_batch=512)
    assert (ds["--rotary-scaling-factor"], ds["--mscale"], ds["--mscale-all-dim"]) == ("40", "1", "1")
    unscaled = _with(load_model("deepseek-v3"), rope=Rope())
    assert _flags(unscaled, dp=64, global_batch=512)["--rope-type"] == "rope"  # MLA's default is YaRN
    partial = _flags(load_model("qwen3-next-80b-a3b"))
    assert partial["--rotary-percent"] == "0.25"
    assert "--rotary-base" not in _flags(load_model("nemotron-3-nano-30b-a3b"))  # no position embedding
    assert _flags(load_model("mistral-7b"))["--window-size"] == "4095,0"  # HF's 4096 keys, as Megatron-Bridge
    gpt3 = _flags(load_model("gpt3-175b"), tp=8, dp=2, global_batch=8, seq_len=2048)
    assert (gpt3["--normalization"], "--swiglu" in gpt3) == ("LayerNorm", False)  # exact GELU: no flag
    flags = _flags(load_model(f"{FIXTURES}/nemotron-4-340b.json"), tp=8, pp=4, dp=2, sequence_parallel=True)
    assert (flags["--rotary-percent"], flags["--normalization"]) == ("0.5", "LayerNorm")
    assert flags["--apply-layernorm-1p"] and flags["--squared-relu"]


def test_moe_routers_read_and_written_as_megatron_bridge_maps_them():
    """``conversion/model_bridge.py`` and the DeepSeek-V3 / Qwen3-MoE bridges of Megatron-Bridge."""
    ds = _flags(load_model("deepseek-v3"), dp=64, global_batch=512)
    assert (ds["--moe-router-score-function"], ds["--moe-router-topk-scaling-factor"]) == ("sigmoid", "2.5")
    assert (ds["--moe-router-num-groups"], ds["--moe-router-group-topk"]) == ("8", "4")
    assert ds["--moe-router-enable-expert-bias"] and "--moe-router-pre-softmax" not in ds
    qwen15 = _flags(load_model(f"{FIXTURES}/qwen1.5-moe-a2.7b.json"))  # norm_topk_prob: false
    assert qwen15["--moe-router-pre-softmax"] and qwen15["--moe-shared-expert-gate"]
    assert "--moe-router-score-function" not in _flags(load_model("qwen3-30b-a3b"))  # softmax, renormalised
    nano = load_model("nemotron-3-nano-30b-a3b").definition.router
    assert (nano.score, nano.scale, nano.expert_bias) == ("sigmoid", 2.5, True)


@pytest.mark.parametrize(
    ("name", "change", "reason"),
    [
        (f"{FIXTURES}/gpt-oss-120b.json", {}, "rope_scaling yarn: Megatron-LM 0.16 has no flag for it"),
        (f"{FIXTURES}/olmo-2-13b.json", {}, "Q/K norm over all heads"),
        (f"{FIXTURES}/llama4-scout-17b-16e.json", {}, "frequency factors"),
        (
            "70b",
            {"rope": Rope(theta=10000.5)},
            "rope_theta 10000.5: Megatron's --rotary-base takes an integer",
        ),
        ("70b", {"rope": Rope(scaling="longrope")}, "rope_scaling longrope"),
        ("deepseek-v3", {"rope": Rope(scaling="yarn", factor=40, beta_fast=16)}, "betas"),
        (f"{FIXTURES}/gpt-oss-120b.json", {}, "18 sliding-window layers of 36: which ones is not kept"),
        (f"{FIXTURES}/gpt-oss-120b.json", {}, "expert and router biases"),
        (f"{FIXTURES}/llama4-scout-17b-16e.json", {}, "chunked attention layers"),
        ("gemma2-27b", {}, "Gemma's four norms per block and GeGLU"),
        ("70b", {"activation": "relu"}, "a gated relu MLP: Megatron-LM 0.16 has SwiGLU"),
        (f"{FIXTURES}/phi-3.5-moe.json", {}, "its sparsemixer router"),
        (f"{FIXTURES}/ernie-4.5-21b-a3b.json", {}, "an expert bias on softmax scores"),
    ],
)
def test_what_megatron_cannot_spell_is_refused_in_one_line(name, change, reason):
    model = _with(load_model(name), **change)
    reasons = megatron_model_unsupported(model)
    assert any(reason in r for r in reasons) and all("\n" not in r for r in reasons)
    with pytest.raises(ConfigError, match="^" + model.name):
        megatron_args_text(ParallelPlan(dp=8, global_batch=64, seq_len=4096, framework="megatron"), model)


def test_emit_skips_megatron_args_and_says_why(tmp_path):
    """The other files are written; summary.md names what Megatron lacks (``emit.writer``)."""
    plan = ParallelPlan(dp=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    argv = ["emit", "--plan", str(tmp_path / "plan.json"), "--model", f"{FIXTURES}/olmo-2-13b.json"]
    assert main([*argv, "--gpus", "8", "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "megatron_args.txt").exists()
    assert "Q/K norm over all heads" in (tmp_path / "out" / "summary.md").read_text()


def test_estimate_json_says_what_was_read(capsys):
    argv = ["estimate", "--model", "deepseek-v3", "--gpus", "256", "--ep", "8", "--framework", "megatron"]
    assert main([*argv, "--sharding", "zero1", "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert (model["rope"]["scaling"], model["rope"]["factor"], model["norm_eps"]) == ("yarn", 40.0, 1e-6)
    assert model["router"]["score"] == "sigmoid" and model["router"]["groups"] == 8
