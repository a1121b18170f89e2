"""megatron_args.txt against megatron-core 0.16.1 (the ``test`` extra installs it; it runs on CPU).

Megatron-LM's ``parse_args`` / ``validate_args`` live in ``megatron/training``, which no PyPI package ships
(the megatron-core wheel and sdist hold ``megatron/core`` only); ``benchmarks/megatron_validate_args.py``
runs them against a Megatron-LM checkout (results in ``benchmarks/results/megatron_validate_args.json``).
Here the emitted flags go through what megatron-core validates itself: ``TransformerConfig`` (its
``__post_init__`` checks heads and query groups against TP, sequence parallelism, recompute, dropout),
built as ``megatron/training/arguments.py::core_transformer_config_from_args`` builds it (each flag's dest
that names a field, plus its renames), and ``DistributedDataParallelConfig``.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess

import pytest
import torch
from emit_cases import CASES

from autotune.emit import megatron_unsupported

core = pytest.importorskip("megatron.core")
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.transformer import MLATransformerConfig, TransformerConfig  # noqa: E402

pytestmark = pytest.mark.slow  # importing megatron.core takes ~10 s on 2 cores

MEGATRON_CASES = [n for n in CASES if not megatron_unsupported(CASES[n].build()[0])]


@pytest.fixture(autouse=True)
def _transformer_engine_version(monkeypatch):
    """Transformer Engine is not installed here; the checks megatron-core gates on its version (fp8 recipes,
    recompute of quantized modules) are asked as 2.10.0 would answer them, as in
    ``benchmarks/megatron_validate_sampled.py``."""
    from megatron.core import utils
    from packaging.version import Version

    monkeypatch.setattr(utils, "get_te_version", lambda: Version("2.10.0"))


_LIST_FLAGS = {"recompute_modules", "offload_modules"}
"""Megatron-LM's ``nargs="*"`` flags among those autotune emits (megatron/training/arguments.py)."""


def _flags(text: str) -> dict[str, object]:
    """``--a-b V`` -> ``{"a_b": "V"}``, ``--flag`` -> ``{"flag": True}``, ``--list A B`` -> ``["A", "B"]``
    (argparse's dest rule)."""
    out: dict[str, object] = {}
    for line in text.splitlines():
        flag, *value = shlex.split(line)
        dest = flag[2:].replace("-", "_")
        out[dest] = value if dest in _LIST_FLAGS else value[0] if value else True
    return out


def _typed(field: dataclasses.Field, value: object) -> object:
    if isinstance(value, bool) or isinstance(field.default, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except (TypeError, ValueError):
            pass
    return value


def _list_expression(text: str) -> list[int]:
    """``([0]*3+[1]*58)`` -> the list, as Megatron's ``moe_freq_type`` evaluates it (ints, lists, * and +)."""
    assert set(text) <= set("()[]0123456789*+, "), text
    return list(eval(text, {"__builtins__": {}}))  # noqa: S307 -- checked to be list arithmetic of ints


def _transformer_config(flags: dict[str, object]) -> TransformerConfig:
    cls = MLATransformerConfig if flags.get("multi_latent_attention") else TransformerConfig
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {k: _typed(fields[k], v) for k, v in flags.items() if k in fields}
    if "norm_epsilon" in flags:  # the field's argparse_meta arg_names (megatron/training/argument_utils.py)
        kwargs["layernorm_epsilon"] = float(str(flags["norm_epsilon"]))
    if "fp8_format" in flags:  # likewise: --fp8-format is the field fp8
        kwargs["fp8"] = str(flags["fp8_format"])
    kwargs["gated_linear_unit"] = bool(flags.get("swiglu"))  # core_transformer_config_from_args renames
    kwargs["add_bias_linear"] = not flags.get("disable_bias_linear")
    if "num_experts" in flags:  # core_transformer_config_from_args: num_moe_experts = args.num_experts
        kwargs["num_moe_experts"] = int(flags["num_experts"])
    if isinstance(flags.get("moe_layer_freq"), str):  # arguments.py moe_freq_type: an int or a list
        text = str(flags["moe_layer_freq"])
        kwargs["moe_layer_freq"] = int(text) if text.isdigit() else _list_expression(text)
    dtype = torch.float16 if flags.get("fp16") else torch.bfloat16 if flags.get("bf16") else torch.float32
    kwargs["params_dtype"] = kwargs["pipeline_dtype"] = dtype  # validate_args' params_dtype
    for flag, field in _UNEVEN_RENAMES.items():  # core_transformer_config_from_args renames
        if flag in flags:
            kwargs[field] = int(str(flags[flag]))
    kwargs["virtual_pipeline_model_parallel_size"] = _virtual_stages(flags)
    return cls(**kwargs)


_UNEVEN_RENAMES = {
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}


def _virtual_stages(flags: dict[str, object]) -> int | None:
    """``validate_args``' virtual pipeline size: from ``--num-virtual-stages-per-pipeline-rank``, or layers
    per stage over ``--num-layers-per-virtual-pipeline-stage`` (the layout's is ``TransformerConfig``'s own);
    1 is None."""
    if "num_virtual_stages_per_pipeline_rank" in flags:
        size = int(str(flags["num_virtual_stages_per_pipeline_rank"]))
    elif "num_layers_per_virtual_pipeline_stage" in flags:
        layers = int(str(flags["num_layers"])) + sum(
            bool(flags.get(f"account_for_{part}_in_pipeline_split")) for part in ("embedding", "loss")
        )
        per_stage, rest = divmod(layers, int(str(flags["pipeline_model_parallel_size"])))
        assert rest == 0, "validate_args: layers must divide over PP"
        size, rest = divmod(per_stage, int(str(flags["num_layers_per_virtual_pipeline_stage"])))
        assert rest == 0, "validate_args: layers per stage must divide over the virtual stages"
    else:
        return None
    return size if size > 1 else None


@pytest.mark.parametrize("name", MEGATRON_CASES)
def test_megatron_core_accepts_the_emitted_flags(name, emitted):
    plan, model, _ = CASES[name].build()
    flags = _flags((emitted(name) / "megatron_args.txt").read_text())
    config = _transformer_config(flags)
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (plan.tp, plan.pp)
    d = model.definition
    assert (config.layernorm_epsilon, config.qk_layernorm) == (d.norm_eps, d.qk_norm == "head")
    assert config.normalization == ("LayerNorm" if d.norm.startswith("layer") else "RMSNorm")
    if model.uses_mla:  # MLATransformerConfig's RoPE: YaRN by default
        scaled = (config.rope_type, config.rotary_scaling_factor, config.mscale, config.mscale_all_dim)
        rope = d.rope
        assert scaled == (
            ("yarn", rope.factor, rope.mscale, rope.mscale_all_dim)
            if rope.scaling
            else ("rope",) + scaled[1:]
        )
    assert config.attention_dropout == 0.0 and config.hidden_dropout == 0.0  # the cost model has no dropout
    ddp = DistributedDataParallelConfig(
        **{
            k: bool(flags.get(k))
            for k in ("overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer")
        }
    )
    reduced = plan.dp * plan.cp > 1  # Megatron reduces gradients over DP x CP; the estimate hides it
    assert ddp.overlap_grad_reduce == reduced
    assert ddp.overlap_param_gather == (reduced and ddp.use_distributed_optimizer)


def test_megatron_core_rejects_what_it_should(emitted):
    """The harness can fail: 64 heads do not split over TP 6."""
    flags = _flags((emitted("megatron_interleaved") / "megatron_args.txt").read_text())
    with pytest.raises(ValueError, match="num_attention_heads"):
        _transformer_config({**flags, "tensor_model_parallel_size": "6"})


@pytest.mark.parametrize("name", MEGATRON_CASES)
def test_the_launch_environment_has_what_validate_args_asserts(name, emitted):
    """``validate_args`` (core_v0.16.1) asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for TP or CP > 1 before
    Blackwell; every launcher sources autotune_env.sh, so its environment is what the script gets."""
    plan, _, _ = CASES[name].build()
    out = emitted(name)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    show = '. "$RUN_DIR/autotune_env.sh"; echo "${CUDA_DEVICE_MAX_CONNECTIONS-}"'
    printed = subprocess.run(
        ["bash", "-c", show], env={**env, "RUN_DIR": str(out)}, capture_output=True, text=True, check=True
    )
    needed = str(plan.framework) == "megatron" and (plan.tp > 1 or plan.cp > 1)
    expected = "32" if plan.moe_a2a_overlap else "1" if needed else ""  # the EP overlap needs > 1
    if str(plan.framework) == "megatron" and str(plan.sharding) == "fsdp-full":
        expected = "8"  # Megatron-FSDP asserts more than one
    assert printed.stdout.strip() == expected


def test_megatron_core_refuses_token_drop_where_the_plan_rules_do(emitted):
    """autotune's legality (``_capacity_errors``) mirrors TransformerConfig: a capacity factor needs the
    all-to-all dispatcher, and padding to capacity needs a capacity factor."""
    flags = _flags((emitted("qwen3_megatron_tokendrop") / "megatron_args.txt").read_text())
    assert _transformer_config(flags).moe_expert_capacity_factor == 1.0
    with pytest.raises(ValueError, match="capacity"):
        _transformer_config({**flags, "moe_token_dispatcher_type": "flex"})


def test_megatron_core_refuses_the_ep_overlap_where_the_plan_rules_do(emitted):
    """autotune's legality (``legalrules.ep_overlap_broken``) mirrors TransformerConfig: the EP overlap
    runs with EP > 1, a virtual pipeline when PP > 1, and no full recompute."""
    flags = _flags((emitted("qwen3_megatron_a2a_overlap") / "megatron_args.txt").read_text())
    config = _transformer_config(flags)
    assert config.overlap_moe_expert_parallel_comm and config.delay_wgrad_compute
    for change in (
        {"expert_model_parallel_size": "1"},
        {"num_layers_per_virtual_pipeline_stage": None},
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": "1"},
    ):
        with pytest.raises((AssertionError, ValueError)):
            _transformer_config({k: v for k, v in {**flags, **change}.items() if v is not None})


def test_megatron_core_checks_the_mtp_module_in_the_emitted_layout(emitted):
    """DeepSeek-V3 with its MTP module: ``--mtp-num-layers 1`` and a layout with ``m`` before the loss, which
    TransformerConfig parses and checks against the layer and MTP counts (refusing it without the ``m``)."""
    text = (emitted("deepseek_v3_mtp_megatron") / "megatron_args.txt").read_text()
    config = _transformer_config(_flags(text))
    assert config.mtp_num_layers == 1 and config.pipeline_model_parallel_layout is not None
    with pytest.raises(AssertionError, match="mtp"):
        _transformer_config(_flags(text.replace("mL\n", "L\n")))


def test_megatron_core_refuses_expert_offload_where_the_plan_rules_do(emitted):
    """autotune's legality (``legality._offload_modules_errors``) mirrors TransformerConfig: fine-grained
    offloading runs without layer-level CPU offloading, of modules Megatron knows (0.16.1; its later
    ``moe``-recompute rule is in ``legality`` too, from Megatron-LM's main)."""
    flags = _flags((emitted("qwen3_megatron_offload_experts") / "megatron_args.txt").read_text())
    config = _transformer_config(flags)
    assert config.fine_grained_activation_offloading and config.offload_modules == ["expert_fc1", "moe_act"]
    layer_offload = {"cpu_offloading": True, "cpu_offloading_num_layers": "1"}
    for change in (layer_offload, {"offload_modules": ["experts"]}):
        with pytest.raises((AssertionError, ValueError)):
            _transformer_config({**flags, **change})


HYBRID_CASES = [n for n in MEGATRON_CASES if CASES[n].build()[1].layer_pattern]


@pytest.mark.parametrize("name", HYBRID_CASES)
def test_megatron_core_builds_the_emitted_hybrid_pattern(name, emitted):
    """``--hybrid-override-pattern`` as ``MambaStack`` allocates it (``allocate_layers``, which asserts its
    length and symbols) and the Mamba-2 heads as ``TransformerConfig`` fields, split by the emitted TP as
    ``MambaMixer`` asserts (heads and groups divisible by TP)."""
    from megatron.core.ssm.mamba_hybrid_layer_allocation import allocate_layers

    plan, model, _ = CASES[name].build()
    flags = _flags((emitted(name) / "megatron_args.txt").read_text())
    layers = allocate_layers(int(flags["num_layers"]), 0.0, 0.0, str(flags["hybrid_override_pattern"]))
    assert "".join(layers) == model.layer_pattern
    config = _transformer_config(flags)
    assert config.is_hybrid_model
    assert (
        config.mamba_num_heads,
        config.mamba_head_dim,
        config.mamba_state_dim,
        config.mamba_num_groups,
    ) == (
        model.mamba_heads,
        model.mamba_head_dim,
        model.mamba_state_dim,
        model.mamba_groups,
    )
    tp = config.tensor_model_parallel_size
    assert config.mamba_num_heads % tp == 0 and config.mamba_num_groups % tp == 0


def test_megatron_core_refuses_the_recompute_modules_the_plan_rules_do():
    """``TransformerConfig`` raises for ``moe_act`` without grouped GEMM (a dense model's flags), for
    ``moe_act`` / ``layernorm`` under fp8 delayed scaling and for layer-level CPU offload beside recompute
    (``legalmemory`` refuses the three plans)."""
    from autotune.catalog import load_model
    from autotune.emit.megatron import megatron_args_text
    from autotune.plan import ParallelPlan

    base = dict(dp=8, global_batch=256, seq_len=4096, framework="megatron", sharding="zero1")
    plan = ParallelPlan(**base, recompute="selective", recompute_modules=("core_attn",))
    dense = _flags(megatron_args_text(plan, load_model("llama3-8b")))
    _transformer_config(dense)
    with pytest.raises(
        ValueError, match="moe_act in recompute_modules is only supported with moe_grouped_gemm"
    ):
        _transformer_config({**dense, "recompute_modules": ["core_attn", "moe_act"]})
    fp8 = plan.replace(ep=8, precision="fp8", recompute_modules=("layernorm", "moe_act"))
    flags = _flags(megatron_args_text(fp8, load_model("qwen3-30b-a3b")))
    _transformer_config(flags)
    with pytest.raises(ValueError, match="Delayed scaling does not support moe_act and layernorm"):
        _transformer_config({**flags, "fp8_recipe": "delayed"})
    offload = {"cpu_offloading": True, "cpu_offloading_num_layers": "1"}  # legalmemory refuses it too
    with pytest.raises(ValueError, match="CPU offloading does not work when activation recomputation"):
        _transformer_config({**dense, **offload})
