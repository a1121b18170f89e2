"""accelerate_fsdp.yaml, validated by accelerate's own code path without launching anything:
``ClusterConfig.from_yaml_file`` (unknown top-level keys, bad enums) -> ``launch_command_parser`` +
``_validate_launch_command`` -> ``prepare_multi_gpu_env`` (the FSDP_* / PARALLELISM_CONFIG_* environment a
launch would export) -> ``FullyShardedDataParallelPlugin()`` and ``ParallelismConfig()`` built from it.
accelerate ignores a mistyped ``fsdp_config`` key, so each key is also checked against the ``--fsdp_*``
launch flags."""

from __future__ import annotations

from unittest import mock

import pytest
import yaml
from emit_cases import CASES

from autotune.emit import accelerate_unsupported, to_accelerate_config, transformer_layer_cls
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan

pytest.importorskip("accelerate")
from accelerate.commands.config.config_args import ClusterConfig  # noqa: E402
from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # noqa: E402
from accelerate.parallelism_config import ParallelismConfig  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin, launch  # noqa: E402


def _launch_env(path, monkeypatch) -> dict[str, str]:
    argv = [
        "--config_file",
        str(path),
        "--machine_rank",
        "0",
        "--main_process_ip",
        "10.0.0.1",
        "--main_process_port",
        "0",
        "train.py",
    ]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    with mock.patch.object(launch, "is_fp8_available", return_value=True):  # no torchao/TE on CI
        env = launch.prepare_multi_gpu_env(args)
    ours = {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG_"))}
    for key, value in ours.items():
        monkeypatch.setenv(key, value)
    return ours


@pytest.mark.parametrize("name", list(CASES))
def test_accelerate_config_passes_accelerate(name, emitted, monkeypatch):
    plan, model, cluster = CASES[name].build()
    path = emitted(name) / "accelerate_fsdp.yaml"
    assert path.exists() == (not accelerate_unsupported(plan))
    if not path.exists():
        return
    config = ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes == cluster.num_gpus and config.num_machines == cluster.num_nodes
    env = _launch_env(path, monkeypatch)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["ACCELERATE_MIXED_PRECISION"] == str(plan.precision)
    grad_op = str(plan.sharding) == "fsdp-grad-op"
    assert env["FSDP_SHARDING_STRATEGY"] == (
        "SHARD_GRAD_OP" if grad_op else "HYBRID_SHARD" if str(plan.sharding) == "hsdp" else "FULL_SHARD"
    )
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is (not grad_op)
    assert plugin.activation_checkpointing is (str(plan.recompute) == "full")
    assert plugin.transformer_cls_names_to_wrap == [transformer_layer_cls(model)]
    if "PARALLELISM_CONFIG_DP_SHARD_SIZE" in env:
        # with tp > 1 the default handler imports transformers (accelerate's TP applies a model's tp_plan)
        pc = ParallelismConfig(tp_handler=object() if plan.tp > 1 else None)
        assert pc.total_size == cluster.num_gpus
        assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size, pc.cp_size) == (
            plan.dp // plan.shard_degree,
            plan.shard_degree,
            plan.tp,
            plan.cp,
        )


def test_every_fsdp_and_parallelism_key_is_a_launch_flag():
    """accelerate copies fsdp_config/parallelism_config keys onto launch arguments by name; a key that
    matches no ``--fsdp_*``/``--parallelism_config_*`` flag would be dropped without a word."""
    flags = {a.dest for a in launch_command_parser()._actions}
    for name in CASES:
        plan, model, cluster = CASES[name].build()
        if accelerate_unsupported(plan):
            continue
        cfg = to_accelerate_config(plan, model, cluster)
        keys = [
            *cfg["fsdp_config"],
            *cfg.get("parallelism_config", {}),
            *(f"fp8_{key}" for key in cfg.get("fp8_config", {})),
        ]  # accelerate adds the fp8_ prefix
        for key in keys:
            assert key in flags, f"{name}: {key} is no accelerate launch flag"


def test_parallelism_config_only_when_the_mesh_needs_it(emitted):
    data = yaml.safe_load((emitted("hsdp") / "accelerate_fsdp.yaml").read_text())
    assert data["distributed_type"] == "FSDP" and data["fsdp_config"]["fsdp_version"] == 2
    assert data["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 4,
        "parallelism_config_dp_shard_size": 8,
        "parallelism_config_tp_size": 1,
        "parallelism_config_cp_size": 1,
    }
    plain = ParallelPlan(dp=8, global_batch=64, seq_len=4096, sharding="fsdp-full")
    _, model, cluster = CASES["zero0"].build()
    assert "parallelism_config" not in to_accelerate_config(plain, model, cluster)


def test_gpt_models_wrap_gpt2_blocks():
    plan, model, cluster = CASES["gpt_megatron"].build()
    assert transformer_layer_cls(model) == "GPT2Block"
    assert transformer_layer_cls(CASES["hsdp"].build()[1]) == "LlamaDecoderLayer"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"sharding": "none"}, "plain DDP"),
        ({"sharding": "zero1", "framework": "deepspeed"}, "optimizer-only"),
        ({"pp": 2, "dp": 4}, "pipeline"),
        ({"offload": True}, "parameters and gradients too"),
        ({"recompute": "selective"}, "not selectively"),
        ({"tp": 2, "dp": 4, "sequence_parallel": True}, "sequence parallel"),
    ],
)
def test_plans_accelerate_cannot_run_get_no_config(changes, reason):
    base = dict(dp=8, micro_batch=1, global_batch=64, seq_len=4096, sharding="fsdp-full")
    plan = ParallelPlan(**{**base, **changes})
    assert any(reason in r for r in accelerate_unsupported(plan))
    with pytest.raises(ConfigError, match="accelerate FSDP cannot express"):
        to_accelerate_config(plan, *CASES["hsdp"].build()[1:])
