"""Models as published: MoE / MLA / GeGLU / head_dim / sliding windows read from config.json, parameter counts
against the published totals, and every config key priced, known not to matter, or refused."""

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from autotune.catalog import load_model, model_from_dict, model_names, preset_config
from autotune.errors import ConfigError
from autotune.modelkeys import NEUTRAL_KEYS, PRICED_KEYS

CONFIGS = Path(__file__).parents[1] / "autotune" / "data" / "hf_configs"
PRESETS = yaml.safe_load((Path(__file__).parents[1] / "autotune" / "data" / "models.yaml").read_text())


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # published: Mistral AI (Mixtral blog: 46.7B / 12.9B), Qwen3 model cards, DeepSeek-V3 report
        # (671B / 37B, main model), Gemma 2 report (27.2B), Mistral-7B card (7.24B), Llama 3.1 card (8.03B)
        ("mixtral-8x7b", 46.7, 12.9),
        ("qwen3-30b-a3b", 30.5, 3.3),
        ("qwen3-235b-a22b", 235, 22),
        ("deepseek-v3", 671, 37),
        ("gemma2-27b", 27.2, 27.2),
        ("mistral-7b", 7.24, 7.24),
        ("llama3.1-8b", 8.03, 8.03),
        ("llama3.1-70b", 70.6, 70.6),  # Llama 3.1 card
        # published config files as presets: Mistral AI (Mixtral 8x22B: 141B / 39B), Phi-3.5-MoE card (42B /
        # 6.6B), OLMoE-1B-7B card (6.9B / 1.3B), Nemotron-4 340B report (341B)
        ("mixtral-8x22b", 141, 39),
        ("phi-3.5-moe", 41.9, 6.6),
        ("olmoe-1b-7b", 6.9, 1.3),
        ("nemotron-4-340b", 341, 341),
    ],
)
def test_presets_match_published_total_and_active(name, total_b, active_b):
    model = load_model(name)
    assert model.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert model.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


def test_published_configs_of_other_families():
    oss = load_model(str(CONFIGS / "gpt-oss-120b.json"))  # model card: 116.8B total, 5.1B active
    assert oss.total_params / 1e9 == pytest.approx(116.8, rel=0.01)
    # OpenAI's active count leaves out the input embedding (a lookup, no FLOPs)
    active = oss.active_params - oss.vocab_size * oss.hidden_size
    assert active / 1e9 == pytest.approx(5.13, rel=0.02)
    assert (oss.num_local_layers, oss.attention_window, oss.expert_bias) == (18, 128, True)
    small = load_model("gpt-oss-20b")  # model card: 20.91B total, 3.61B active (the same convention)
    assert small.total_params / 1e9 == pytest.approx(20.91, rel=0.01)
    assert (small.active_params - small.vocab_size * small.hidden_size) / 1e9 == pytest.approx(3.61, rel=0.01)
    scout = load_model(str(CONFIGS / "llama4-scout-17b-16e.json"))  # 17B active; 109B with the vision tower
    assert scout.active_params / 1e9 == pytest.approx(17.0, rel=0.02)
    assert 105 < scout.total_params / 1e9 < 109
    assert (scout.num_local_layers, scout.chunked_attention, scout.shared_ffn_hidden_size) == (36, True, 8192)
    qwen2 = load_model(str(CONFIGS / "qwen1.5-moe-a2.7b.json"))  # model card: 14.3B total, 2.7B active
    assert (qwen2.total_params / 1e9, qwen2.active_params / 1e9) == (
        pytest.approx(14.3, rel=0.02),
        pytest.approx(2.7, rel=0.02),
    )
    v2 = load_model(str(CONFIGS / "deepseek-v2-lite.json"))  # DeepSeek-V2 paper: V2-Lite 15.7B total
    assert v2.total_params / 1e9 == pytest.approx(15.7, rel=0.01)
    assert (v2.q_lora_rank, v2.kv_lora_rank, v2.moe_layers[0], len(v2.moe_layers)) == (0, 512, 1, 26)


@pytest.mark.parametrize(
    ("config", "total_b"),
    [  # model cards: Qwen2.5-72B 72.7B, Phi-4 14.7B, OLMo-2-1124-13B 13.7B, Qwen3-32B 32.8B,
        # Mistral-Small-24B 23.6B, Gemma 3 1B 1.0B, Command R 35B (tied embeddings, the key omitted)
        ("qwen2.5-72b.json", 72.7),
        ("phi-4.json", 14.7),
        ("olmo-2-13b.json", 13.7),
        ("qwen3-32b.json", 32.8),
        ("mistral-small-24b.json", 23.6),
        ("gemma-3-1b.json", 1.0),
        ("command-r.json", 35.0),
    ],
)
def test_dense_configs_of_2024_2025_read_at_their_published_size(config, total_b):
    """Configs with position keys (Phi-3/4 LongRoPE's ``original_max_position_embeddings``), Qwen2's QKV
    bias, Gemma 3's local layers and Cohere's scalar logit scale read without a refusal, at the size their
    cards state."""
    assert load_model(str(CONFIGS / config)).total_params / 1e9 == pytest.approx(total_b, rel=0.01)


@pytest.mark.parametrize(
    ("config", "total_b", "active_b"),
    [  # Mistral AI (Mixtral 8x22B: 141B / 39B), OLMoE paper (OLMoE-1B-7B: 6.9B / 1.3B), Phi-3.5-MoE model
        # card (42B / 6.6B; its training noise and output bias are priced as neutral)
        ("mixtral-8x22b.json", 141, 39),
        ("olmoe-1b-7b.json", 6.9, 1.3),
        ("phi-3.5-moe.json", 42, 6.6),
    ],
)
def test_moe_configs_read_at_their_published_total_and_active(config, total_b, active_b):
    model = load_model(str(CONFIGS / config))
    assert model.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert model.active_params / 1e9 == pytest.approx(active_b, rel=0.02)


def test_glm45_reads_as_moe_with_partial_rope_and_its_mtp_module():
    """GLM-4.5 (model card: 355B total, 32B active): partial RoPE (``partial_rotary_factor``) is position
    encoding, DeepSeek-style experts with three dense layers, one MTP module counted apart. Its active 32B
    leaves out the input embedding and the output head."""
    glm = load_model(str(CONFIGS / "glm-4.5.json"))
    assert (glm.num_experts, glm.experts_per_token, len(glm.moe_layers), glm.mtp_layers) == (160, 8, 89, 1)
    assert (glm.total_params + glm.mtp_params) / 1e9 == pytest.approx(355, rel=0.01)
    active = glm.active_params - 2 * glm.vocab_size * glm.hidden_size
    assert active / 1e9 == pytest.approx(32, rel=0.02)


def test_ernie45_reads_its_own_expert_keys():
    """ERNIE-4.5-21B-A3B (model card: "21B total, 3B activated", rounded down like Qwen3-30B-A3B's 30.5B):
    its expert keys are ERNIE's own names (``moe_num_experts``, ``moe_k``, ``moe_num_shared_experts``), layer
    0 is dense (``moe_layer_start_index`` 1) and the embeddings are tied."""
    ernie = load_model(str(CONFIGS / "ernie-4.5-21b-a3b.json"))
    assert (ernie.num_experts, ernie.experts_per_token, ernie.shared_ffn_hidden_size) == (64, 6, 2 * 1536)
    assert ernie.moe_layers == tuple(range(1, 28))
    assert 21 <= ernie.total_params / 1e9 < 22
    assert 3 <= (ernie.active_params - ernie.vocab_size * ernie.hidden_size) / 1e9 < 3.2


def test_minimax_m2_reads_its_experts_and_mtp_modules():
    """MiniMax-M2 (model card: 230B total, 10B active): 256 experts of ``intermediate_size`` on every layer,
    top-8, no shared expert, softmax attention on every layer (``attn_type_list`` all 1), three MTP modules
    (``use_mtp``, ``num_mtp_modules``) counted apart; its 10B leaves out both vocabulary matrices."""
    m2 = load_model(str(CONFIGS / "minimax-m2.json"))
    assert (m2.num_experts, m2.experts_per_token, len(m2.moe_layers), m2.mtp_layers) == (256, 8, 62, 3)
    assert m2.total_params / 1e9 == pytest.approx(230, rel=0.01)
    active = m2.active_params - 2 * m2.vocab_size * m2.hidden_size
    assert active / 1e9 == pytest.approx(10, rel=0.03)
    lightning = json.loads((CONFIGS / "minimax-m2.json").read_text())
    lightning["attn_type_list"] = [0] * 7 + [1]  # MiniMax-M1's pattern
    with pytest.raises(ConfigError, match="lightning"):
        model_from_dict(lightning, name="m1")


def test_dense_layers_of_each_rule():
    ds = load_model("deepseek-v3")
    assert ds.moe_layers == tuple(range(3, 61))
    cfg = {**PRESETS["qwen3-30b-a3b"], "decoder_sparse_step": 2, "mlp_only_layers": [1, 3]}
    assert model_from_dict(cfg, name="q").moe_layers == tuple(i for i in range(5, 48, 2))
    scout = json.loads((CONFIGS / "llama4-scout-17b-16e.json").read_text())
    maverick = model_from_dict({**scout, "interleave_moe_layer_step": 2, "num_local_experts": 128}, name="m")
    assert maverick.moe_layers == tuple(range(1, 48, 2))  # Maverick: 400B total, 17B active
    assert maverick.active_params / 1e9 == pytest.approx(17.2, rel=0.02)
    assert maverick.total_params / 1e9 == pytest.approx(400, rel=0.02)


def test_dense_fixes_change_the_count():
    gemma = load_model("gemma2-27b")
    shape = (gemma.gated_mlp, gemma.tie_embeddings, gemma.head_dim, gemma.num_local_layers)
    assert shape == (True, True, 128, 23)
    mixtral, mistral = load_model("mixtral-8x7b"), load_model("mistral-7b")
    assert mixtral.total_params > 6 * mistral.total_params


def _published_keys():
    for name in PRESETS:
        yield name, preset_config(name)


def test_every_published_config_file_is_a_preset_by_its_name():
    """``--model gpt-oss-120b`` reads the packaged config.json; no file in data/hf_configs/ is left out."""
    files = {path.stem for path in CONFIGS.glob("*.json")}
    assert files <= set(model_names())
    assert {PRESETS[name]["config"] for name in files} == {f"hf_configs/{name}.json" for name in files}
    assert load_model("gpt-oss-120b").num_experts == 128


@pytest.mark.parametrize(("name", "cfg"), list(_published_keys()), ids=[n for n, _ in _published_keys()])
def test_every_published_key_is_priced_or_known_neutral(name, cfg):
    unknown = [k for k in cfg if k not in PRICED_KEYS and k not in NEUTRAL_KEYS]
    assert not unknown
    model_from_dict(cfg, name=name)  # and reads without a refusal


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"use_bias": True}, "use_bias"),
        ({"vision_config": {}}, "vision_config"),
        ({"sinkhorn_iterations": 3}, "sinkhorn_iterations"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        ({"first_k_dense_replace": 61}, "no MoE layer"),
    ],
)
def test_unpriceable_keys_are_refused_in_one_line(change, message):
    with pytest.raises(ConfigError, match=message) as err:
        model_from_dict({**PRESETS["deepseek-v3"], **change}, name="ds")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "names"),
    [  # marker keys of Jamba's, Falcon-H1's and DeepSeek-V3.2's config.json
        ({"attn_layer_period": 8, "mamba_d_state": 16}, "Mamba-2"),
        ({"mamba_d_ssm": 1024}, "Mamba-2"),
        ({"index_topk": 2048, "index_n_heads": 64}, "DeepSeek Sparse Attention"),
        ({"layer_types": ["full_attention", "conv"]}, "layers of type conv"),
    ],
)
def test_other_token_mixers_are_named_in_the_refusal(change, names):
    """A config of an architecture autotune does not price says which one, in one line, before any
    "unknown key" (deleting keys one by one would plan a softmax-attention model that is not the user's)."""
    with pytest.raises(ConfigError, match=names) as err:
        model_from_dict({**PRESETS["qwen3-30b-a3b"], **change}, name="q")
    assert "\n" not in str(err.value)


def test_qwen3_next_reads_its_gated_deltanet_layers():
    """Qwen3-Next-80B-A3B (model card: 80B total, 3B activated): Gated DeltaNet on 3 of every 4 layers
    (``full_attention_interval`` 4), 16 key / 32 value heads of 128, output-gated softmax attention on the
    others, 512 experts top-10 plus a shared one; its 3B leaves out both vocabulary matrices."""
    q = load_model(str(CONFIGS / "qwen3-next-80b-a3b.json"))
    assert dataclasses.asdict(load_model("qwen3-next-80b-a3b")) == {
        **dataclasses.asdict(q),
        "name": "qwen3-next-80b-a3b",
    }  # the preset is the config
    assert (q.num_linear_layers, q.linear_key_heads, q.linear_value_heads, q.attention_output_gate) == (
        36,
        16,
        32,
        True,
    )
    assert q.total_params / 1e9 == pytest.approx(80, rel=0.01)
    assert 3.0 <= (q.active_params - 2 * q.vocab_size * q.hidden_size) / 1e9 < 3.5


def test_qwen35_lists_its_layers_by_type_and_counts_its_mtp_module():
    """Qwen3.5's text config: ``layer_types`` instead of an interval, ``attn_output_gate`` and
    ``mtp_num_hidden_layers``; the same shape read either way prices alike."""
    nxt = json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text())
    interval = nxt.pop("full_attention_interval")
    types = ["linear_attention"] * (interval - 1) + ["full_attention"]
    q35 = {**nxt, "model_type": "qwen3_5_moe_text", "layer_types": types * 12, "attn_output_gate": True}
    a, b = (
        model_from_dict({**nxt, "full_attention_interval": interval}, name="n"),
        model_from_dict(q35, name="n"),
    )
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert model_from_dict({**q35, "mtp_num_hidden_layers": 1}, name="n").mtp_layers == 1
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        model_from_dict({**q35, "linear_num_key_heads": 0}, name="n")


def test_attention_layer_types_still_read():
    """``layer_types`` of softmax-attention layers (gpt-oss, Gemma 3; newer Llama 4 configs write
    ``chunked_attention``) is not a refusal."""
    types = ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"] * 12
    scout = json.loads((CONFIGS / "llama4-scout-17b-16e.json").read_text())
    assert model_from_dict({**scout, "layer_types": types}, name="s").num_local_layers == 36


def test_multi_token_prediction_is_read_and_counted_apart_from_the_main_model():
    """DeepSeek-V3's config.json: ``num_nextn_predict_layers: 1``, one MTP module of an MoE block, two norms,
    a final norm and ``eh_proj`` (2h x h); the main model keeps its published 671B."""
    main = model_from_dict(PRESETS["deepseek-v3"], name="ds")
    mtp = model_from_dict({**PRESETS["deepseek-v3"], "num_nextn_predict_layers": 1}, name="ds")
    assert (main.mtp_layers, mtp.mtp_layers) == (0, 1)
    assert mtp.total_params == main.total_params and mtp.active_params == main.active_params
    assert mtp.mtp_params == pytest.approx(11.61e9, rel=0.01)  # one MoE block 11.5B + eh_proj 0.10B
    assert mtp.mtp_params > main.params_per_layer  # an MoE block: above the mean of 3 dense + 58 MoE


def test_spec_round_trips_through_asdict():
    import dataclasses

    from autotune.specs import ModelSpec

    ds = load_model("deepseek-v3")
    data = json.loads(json.dumps(dataclasses.asdict(ds)))
    assert ModelSpec(**data) == ds


@pytest.mark.parametrize("name", list(PRESETS))
def test_plan_file_config_rebuilds_the_spec(name):
    import dataclasses

    from autotune.emit.planfile import model_to_config

    model = load_model(name)
    again = model_from_dict(model_to_config(model), name=model.name)
    assert dataclasses.asdict(again) == dataclasses.asdict(model)
