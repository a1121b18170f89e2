"""Multi-token prediction of hybrid Mamba-2 models (Nemotron 3 Super / Ultra, 3.5 Lightning): the MTP block is
the config's pattern (``*E``: an attention and an MoE layer), by default one module run at every depth
(Megatron-Bridge ``NemotronHBridge``; megatron-core 0.17 ``mtp_use_repeated_layer``), priced as those
layers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from autotune import modelshape
from autotune.catalog import make_cluster, model_from_dict
from autotune.costmodel import flops
from autotune.costmodel.estimate import estimate
from autotune.emit.megatronmodel import megatron_model_unsupported
from autotune.emit.planfile import model_to_config
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan

DATA = Path(__file__).resolve().parents[2] / "autotune" / "data" / "models.yaml"
SUPER = {
    k: v for k, v in yaml.safe_load(DATA.read_text())["nemotron-3-super-120b-a12b"].items() if k != "source"
}
CONFIGS = Path(__file__).resolve().parents[2] / "autotune" / "data" / "hf_configs"
NANO = json.loads((CONFIGS / "nemotron-3-nano-30b-a3b.json").read_text())
MTP2 = {"num_nextn_predict_layers": 2, "mtp_hybrid_override_pattern": "*E"}


def _super(**changes):
    return model_from_dict({**SUPER, **changes}, name="super")


def _plan(**kw):
    base = dict(dp=64, ep=64, global_batch=512, seq_len=8192, framework="megatron", sharding="zero1")
    return ParallelPlan(**{**base, **kw})


def test_the_mtp_block_is_read_as_megatron_bridge_reads_it():
    """``num_nextn_predict_layers`` depths of ``mtp_hybrid_override_pattern``, shared unless
    ``mtp_use_repeated_layer`` is false; transformers' list form and its default (``*E``) read the same."""
    shared = _super(**MTP2)
    assert (shared.mtp_layers, shared.mtp_pattern, shared.mtp_shared) == (2, "*E", True)
    kinds = _super(num_nextn_predict_layers=2, mtp_layers_block_type=["full_attention", "moe"])
    assert kinds == dataclasses.replace(shared, name="super")
    assert _super(num_nextn_predict_layers=2) == kinds  # transformers' default block
    apart = _super(**MTP2, mtp_use_repeated_layer=False)
    assert not apart.mtp_shared and apart.mtp_params == 2 * shared.mtp_params
    assert _super(num_nextn_predict_layers=0, mtp_layers_block_type=["full_attention", "moe"]).mtp_layers == 0


def test_a_shared_module_is_one_attention_and_one_moe_layer_of_parameters():
    """One module: the attention layer, the MoE layer (512 latent experts, the shared expert, the router and
    the latent projections), each with its pre-norm, plus enorm, hnorm, final norm and eh_proj; about 2.9B."""
    model = _super(**MTP2)
    block = modelshape.mtp_block_model(model)
    assert (block.layer_pattern, block.moe_layers, block.mtp_layers) == ("*E", (1,), 0)
    h = model.hidden_size
    attention = modelshape.attention_weight_params(model)
    expected = attention + modelshape.moe_mlp_params(model) + 2 * h + 2 * h * h + 3 * h
    assert model.mtp_params == expected
    assert model.mtp_params / 1e9 == pytest.approx(2.94, abs=0.01)
    assert model.total_params == _super().total_params  # main model only, as before


def test_flops_and_time_are_the_pattern_layers_not_the_mean_layer():
    """Each depth adds an attention and an MoE layer, eh_proj and a head pass (13 % of Super's model FLOPs at
    two depths); the main model's mean layer, 40 of 88 Mamba-2, would price another block."""
    model, main, s = _super(**MTP2), _super(), 8192
    block = modelshape.mtp_block_model(model)
    per_depth = 2 * (flops.layer_gemm_flops_per_token(block) + flops.attention_flops_per_token(block, s))
    head = flops.lm_head_flops_per_token(model)
    added = flops.model_flops_per_token(model, s) - flops.model_flops_per_token(main, s)
    assert added == pytest.approx(3 * 2 * (per_depth + 4 * model.hidden_size**2 + head))
    assert 1.10 < flops.model_flops_per_token(model, s) / flops.model_flops_per_token(main, s) < 1.16
    cluster = make_cluster(num_gpus=64, gpu="gb300")
    slower = estimate(model, cluster, _plan()).step_time_s / estimate(main, cluster, _plan()).step_time_s
    assert 1.08 < slower < 1.2


def test_a_shared_module_holds_one_set_of_states_and_each_depth_its_activations():
    cluster, plan = make_cluster(num_gpus=64, gpu="gb300"), _plan()
    main, shared = estimate(_super(), cluster, plan).memory, estimate(_super(**MTP2), cluster, plan).memory
    apart = estimate(_super(**MTP2, mtp_use_repeated_layer=False), cluster, plan).memory
    one = estimate(_super(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E"), cluster, plan).memory
    assert main.weights_bytes < shared.weights_bytes == one.weights_bytes < apart.weights_bytes
    assert shared.optimizer_bytes == one.optimizer_bytes < apart.optimizer_bytes
    assert one.activations_bytes < shared.activations_bytes == apart.activations_bytes
    assert main.logits_bytes < one.logits_bytes < shared.logits_bytes  # a head pass and loss per depth


def test_megatron_args_are_left_out_with_the_0_17_flags_named_and_the_plan_file_keeps_the_block():
    """Megatron-LM 0.16.1 (what autotune emits for) has no MTP in MambaModel; 0.17 takes the unified
    pattern (megatron/training/arguments.py ``--hybrid-layer-pattern``)."""
    model = _super(**MTP2)
    assert not check_plan(_plan(), model, make_cluster(num_gpus=64, gpu="gb300"))
    (reason,) = megatron_model_unsupported(model)
    assert "--hybrid-layer-pattern MAIN/*E/*E --mtp-use-repeated-layer" in reason
    again = model_from_dict(model_to_config(model), name=model.name)
    assert dataclasses.asdict(again) == dataclasses.asdict(model)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(mtp_hybrid_override_pattern="*X"), "'mtp_hybrid_override_pattern' must be a string of M"),
        (dict(mtp_layers_block_type=["attention", "conv"]), "'mtp_layers_block_type' entries must be one of"),
        (dict(mtp_use_repeated_layer="yes"), "'mtp_use_repeated_layer' must be true or false"),
    ],
)
def test_a_bad_mtp_block_is_a_one_line_error(changes, message):
    with pytest.raises(ConfigError, match=message) as err:
        model_from_dict({**NANO, "num_nextn_predict_layers": 1, **changes}, name="nano")
    assert "\n" not in str(err.value)


def test_a_dense_hybrid_takes_transformers_default_block_only_if_it_says_its_own():
    """transformers' default MTP block (``*E``) has an MoE layer; a dense hybrid (Nemotron-H) must name its
    block, and then prices it."""
    dense = {**NANO, "hybrid_override_pattern": NANO["hybrid_override_pattern"].replace("E", "-")}
    for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts"):
        dense.pop(key, None)
    dense.pop("moe_shared_expert_intermediate_size", None)
    with pytest.raises(ConfigError, match="set key 'mtp_hybrid_override_pattern'"):
        model_from_dict({**dense, "num_nextn_predict_layers": 1}, name="h")
    ok = model_from_dict(
        {**dense, "num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*-"}, name="h"
    )
    assert ok.mtp_pattern == "*-" and ok.mtp_params > 0


@pytest.mark.parametrize(
    "key", ["mtp_hybrid_override_pattern", "mtp_layers_block_type", "mtp_use_repeated_layer"]
)
def test_a_hybrid_mtp_key_on_a_transformer_is_refused_not_ignored(key):
    ds = {k: v for k, v in yaml.safe_load(DATA.read_text())["deepseek-v3"].items() if k != "source"}
    with pytest.raises(ConfigError, match=f"key '{key}' is priced for hybrid"):
        model_from_dict({**ds, "num_nextn_predict_layers": 1, key: True}, name="ds")


def test_transformers_5_layer_names_read_as_the_legacy_ones():
    """transformers 5 names Mamba-2 ``linear_attention`` and attention ``full_attention``
    (``configuration_utils._LEGACY_LAYER_TYPE_REMAP``); a config it saved lists the layers so."""
    new = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    nano = model_from_dict(NANO, name="nano")
    cfg = {**NANO, "layers_block_type": [new[c] for c in nano.layer_pattern]}
    cfg.pop("hybrid_override_pattern", None)
    assert model_from_dict(cfg, name="nano") == nano
