"""ds_config.json, validated by DeepSpeed's own ``DeepSpeedConfig`` at the plan's DP size.

Without a process group DeepSpeedConfig assumes world size 1, so ``deepspeed.comm.get_rank/get_world_size``
are patched and an mpu reports the DP degree (TP/PP ranks do not count in the batch rule). DeepSpeed's checks
are bare asserts and it ignores unknown keys, so the emitter's own checks are tested too.
"""

from __future__ import annotations

import inspect
import json
from unittest import mock

import pytest
from emit_cases import CASES

from autotune.emit import check_ds_config, deepspeed_unsupported, to_ds_config
from autotune.emit.deepspeed import DS_TOP_LEVEL_KEYS
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime import config as ds_config_module  # noqa: E402
from deepspeed.runtime import constants as ds_constants  # noqa: E402
from deepspeed.runtime.activation_checkpointing import config as ds_ac_config  # noqa: E402
from deepspeed.runtime.tensor_parallel import config as ds_tp_config  # noqa: E402
from deepspeed.runtime.zero import config as ds_zero_config  # noqa: E402


class _MPU:
    """The one method DeepSpeedConfig asks an mpu for."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


def _deepspeed_config(cfg: dict, *, dp: int, world: int):
    import deepspeed.comm as dist

    with (
        mock.patch.object(dist, "get_rank", return_value=0),
        mock.patch.object(dist, "get_world_size", return_value=world),
    ):
        return ds_config_module.DeepSpeedConfig(cfg, mpu=_MPU(dp))


@pytest.mark.parametrize("name", list(CASES))
def test_ds_config_passes_deepspeed(name, emitted):
    plan, _, _ = CASES[name].build()
    path = emitted(name) / "ds_config.json"
    assert path.exists() == (not deepspeed_unsupported(plan))
    if not path.exists():
        return
    cfg = json.loads(path.read_text())
    ds = _deepspeed_config(cfg, dp=plan.dp, world=plan.world_size)
    assert ds.world_size == plan.dp
    assert ds.train_batch_size == plan.global_batch
    assert ds.train_micro_batch_size_per_gpu == plan.micro_batch
    assert ds.gradient_accumulation_steps == plan.num_microbatches
    assert ds.zero_optimization_stage == plan.zero_stage
    assert ds.bfloat16_config.enabled == (str(plan.precision) == "bf16")
    assert ds.float16_config.enabled == (str(plan.precision) == "fp16")
    assert ds.gradient_clipping == 1.0
    offload = ds.zero_config.offload_optimizer
    assert (offload is not None and str(offload.device).endswith("cpu")) == plan.offload
    assert ds.tensor_parallel_config.autotp_size == (plan.tp if plan.tp > 1 else 0)
    if plan.pp > 1:  # stages/partition are PipelineModule arguments; the engine reads only these
        assert set(cfg["pipeline"]) == {"activation_checkpoint_interval"}
        assert cfg["zero_optimization"]["overlap_comm"] is False  # the pipeline engine turns it off
    assert ("activation_checkpointing" in cfg) == (str(plan.recompute) != "none")


def test_harness_catches_a_wrong_batch():
    """The patched DP size is what DeepSpeed checks: a config for DP=8 fails at DP=4."""
    plan, model, _ = CASES["zero0"].build()
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        _deepspeed_config(to_ds_config(plan, model), dp=4, world=4)


def test_autotp_states_the_global_batch():
    """DeepSpeed needs an mpu to count DP as world / TP (tests/trials/test_ds_autotp_batch.py runs it)."""
    plan, model, _ = CASES["autotp"].build()
    cfg = to_ds_config(plan, model)
    assert cfg["train_batch_size"] == plan.global_batch and cfg["tensor_parallel"] == {"autotp_size": 2}


def test_ulysses_sets_the_sequence_parallel_size_and_says_how_to_wire_it(emitted):
    """DeepSpeed-Ulysses: ``sequence_parallel_size`` (what DeepSpeed's config and HF's integration read),
    and the notes name the mpu and the attention wrapper the script needs."""
    plan, _, _ = CASES["ds_ulysses"].build()
    out = emitted("ds_ulysses")
    assert json.loads((out / "ds_config.json").read_text())["sequence_parallel_size"] == plan.cp == 4
    notes = (out / "summary.md").read_text()
    assert "initialize_sequence_parallel(4)" in notes and "DistributedAttention" in notes


def _deepspeed_string_constants(*modules) -> set[str]:
    return {v for m in modules for k, v in vars(m).items() if k.isupper() and isinstance(v, str)}


def test_every_emitted_key_is_one_deepspeed_reads():
    known = _deepspeed_string_constants(ds_constants, ds_zero_config, ds_ac_config)
    # "pipeline" and "tensor_parallel" are string literals in the functions that read them
    source = inspect.getsource(ds_config_module) + inspect.getsource(ds_tp_config)
    known |= {key for key in DS_TOP_LEVEL_KEYS if f'"{key}"' in source or f"'{key}'" in source}
    assert DS_TOP_LEVEL_KEYS <= known
    ac_keys = _deepspeed_string_constants(ds_ac_config)
    pipeline_keys = set(ds_config_module.get_pipeline_config({}))
    for name in CASES:
        plan, model, _ = CASES[name].build()
        if deepspeed_unsupported(plan):
            continue
        cfg = to_ds_config(plan, model)
        assert set(cfg.get("activation_checkpointing", {})) <= ac_keys
        assert set(cfg.get("pipeline", {})) <= pipeline_keys


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_batch_size": 65}, "train_batch_size 65"),
        ({"gradient_accumulation_steps": 3}, "accumulation 3"),
        ({"optimizer": {"type": "AdamW"}}, "key 'optimizer'"),
        ({"bf16": {"enabled": "auto"}}, "'auto'"),
    ],
)
def test_emitter_checks_what_deepspeed_only_asserts(change, message):
    plan, model, _ = CASES["zero0"].build()
    cfg = {**to_ds_config(plan, model), **change}
    with pytest.raises(ConfigError, match=message):
        check_ds_config(cfg, dp=plan.dp, global_batch=plan.global_batch)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"cp": 2, "dp": 4}, "context parallelism"),
        ({"sharding": "hsdp", "hsdp_shard_size": 4}, "MiCS"),
        ({"sharding": "fsdp-grad-op"}, "ZeRO-2 keeps them whole"),
        ({"precision": "fp8"}, "fp8"),
        ({"tp": 2, "dp": 4, "sequence_parallel": True}, "sequence parallel"),
        ({"pp": 2, "dp": 4, "schedule": "gpipe", "framework": "fsdp"}, "1F1B only"),
    ],
)
def test_plans_deepspeed_cannot_run_get_no_config(changes, reason):
    base = dict(dp=8, micro_batch=1, global_batch=64, seq_len=4096, sharding="fsdp-full")
    plan = ParallelPlan(**{**base, **changes})
    assert any(reason in r for r in deepspeed_unsupported(plan))
    with pytest.raises(ConfigError, match="DeepSpeed cannot express"):
        to_ds_config(plan)
