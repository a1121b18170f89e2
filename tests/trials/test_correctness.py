"""Every supported layout trains like one process: the loss of each of the first three steps, from the same
seed, equals a plain single-process run within 1e-4 relative (fp32 on gloo; observed differences are ~1e-7,
from reduction order). Each layout runs as a real trial through its backend, so the result.json contract
is checked on the way.
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache

import pytest
from trial_helpers import LR, MEASURE, SEED, WARMUP, make_request, reference_losses

from autotune.backends.deepspeed import DeepSpeedBackend
from autotune.backends.torchrun import TorchrunBackend
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ModelSpec
from autotune.trials.result import TrialResult, TrialStatus

REL_TOL = 1e-4
SEQ = 32

LAYOUTS: dict[str, dict[str, object]] = {
    # two ranks, global batch 4
    "dp2": {"dp": 2},  # replicate (DDP), 2 micro-batches
    "tp2-sp": {"tp": 2, "sequence_parallel": True, "micro_batch": 2},
    "pp2-1f1b": {"pp": 2},
    "pp2-gpipe": {"pp": 2, "schedule": "gpipe", "micro_batch": 2},
    "pp2-interleaved-zb+full-ac": {
        "pp": 2,
        "schedule": "interleaved-zb",
        "virtual_stages": 2,
        "recompute": "full",
    },  # torch's zero bubble: input and weight gradients in two passes, the checkpoint re-run in each
    "pp2-zbv": {"pp": 2, "schedule": "zbv", "virtual_stages": 2},  # V: rank 0 has the embedding and the head
    "fsdp-full": {"dp": 2, "sharding": "fsdp-full"},
    "fsdp-grad-op+full-ac": {"dp": 2, "sharding": "fsdp-grad-op", "recompute": "full"},
    "ds-zero1": {"dp": 2, "sharding": "zero1", "framework": "deepspeed"},
    "ds-zero2": {"dp": 2, "sharding": "zero2", "framework": "deepspeed"},
    "ds-zero3+sel-ac": {"dp": 2, "sharding": "zero3", "framework": "deepspeed", "recompute": "selective"},
    "ds-pp2+full-ac": {"pp": 2, "framework": "deepspeed", "recompute": "full"},
    "ds-autotp2": {"tp": 2, "framework": "deepspeed"},
    "ds-zero2+offload": {"dp": 2, "sharding": "zero2", "offload": True, "framework": "deepspeed"},
    "gpt-style-tp2-sp": {"tp": 2, "sequence_parallel": True, "micro_batch": 2},  # GPT-2-shaped tiny
    "ds-ulysses-cp2+zero3": {"cp": 2, "cp_comm": "a2a", "sharding": "zero3", "framework": "deepspeed"},
    "gpt-style-ds-ulysses-cp2+full-ac": {
        "cp": 2,
        "cp_comm": "a2a",
        "framework": "deepspeed",
        "recompute": "full",
    },  # learned positions: each rank embeds its slice's own positions
    # four ranks, global batch 8
    "hsdp-2x2": {"dp": 4, "sharding": "hsdp", "hsdp_shard_size": 2},
    "tp2xdp2-fsdp": {"tp": 2, "dp": 2, "sharding": "fsdp-full"},
    "pp2xdp2": {"pp": 2, "dp": 2},
    "tp2xpp2-interleaved-sp": {
        "tp": 2,
        "pp": 2,
        "schedule": "interleaved",
        "virtual_stages": 2,
        "recompute": "selective",
        "sequence_parallel": True,
    },  # Partial norm grads
    "tp2xdp2-fsdp-sp": {"tp": 2, "dp": 2, "sharding": "fsdp-full", "sequence_parallel": True},
    "ds-ulysses-cp2xdp2+zero2+sel-ac": {
        "cp": 2,
        "dp": 2,
        "cp_comm": "a2a",
        "sharding": "zero2",
        "framework": "deepspeed",
        "recompute": "selective",
    },  # ZeRO over the sequence-data-parallel group
}


def _model(layout: str, tiny: ModelSpec) -> ModelSpec:
    """``gpt-style-*`` layouts run a GPT-2-shaped tiny: LayerNorm with bias, GELU MLP, learned positions."""
    if layout.startswith("gpt-style"):
        return dataclasses.replace(tiny, gated_mlp=False, learned_positions=True, bias=True)
    return tiny


def _plan(fields: dict[str, object]) -> ParallelPlan:
    plan = ParallelPlan(global_batch=4, seq_len=SEQ, **fields)
    if plan.world_size == 4:
        plan = plan.replace(global_batch=8)
    return plan


@cache
def _reference(model, global_batch: int) -> tuple[float, ...]:
    return tuple(reference_losses(model, global_batch=global_batch, seq_len=SEQ, steps=WARMUP + MEASURE))


@pytest.mark.slow
def test_reference_is_sensitive_to_the_update(tiny):
    """The comparison means something: without the update the third loss differs by ~50 x REL_TOL."""
    trained = _reference(tiny, 4)
    frozen = reference_losses(tiny, global_batch=4, seq_len=SEQ, steps=WARMUP + MEASURE, lr=0.0)
    assert trained[0] == pytest.approx(frozen[0], rel=1e-6)
    assert abs(trained[-1] - frozen[-1]) / frozen[-1] > 20 * REL_TOL  # ~50x at lr 1e-2


@pytest.mark.dist(timeout=150)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, tiny, tmp_path):
    plan, model = _plan(LAYOUTS[layout]), _model(layout, tiny)
    backend_cls = DeepSpeedBackend if plan.framework is Framework.DEEPSPEED else TorchrunBackend
    backend = backend_cls(device="cpu", seed=SEED, lr=LR)
    result = backend.run(make_request(model, plan, tmp_path / layout))

    assert result.status is TrialStatus.OK, result.error
    expected = _reference(model, plan.global_batch)
    assert result.extra["losses"] == pytest.approx(list(expected), rel=REL_TOL)
    assert result.loss == pytest.approx(expected[-1], rel=REL_TOL)
    _check_contract(result, tmp_path / layout, plan)


def _check_contract(result: TrialResult, trial_dir, plan: ParallelPlan) -> None:
    for name in ("plan.json", "trial.json", "cmd.txt", "stdout.log", "stderr.log", "result.json"):
        assert (trial_dir / name).is_file(), name
    assert ParallelPlan.from_dict(json.loads((trial_dir / "plan.json").read_text())) == plan
    assert TrialResult.read(trial_dir / "result.json") == result
    assert "--trial-dir" in (trial_dir / "cmd.txt").read_text()
    assert len(result.extra["progress"]) == MEASURE
    assert result.tokens_per_s == pytest.approx(plan.tokens_per_step / result.step_time_s)
    assert result.step_time_cov >= 0 and result.peak_memory_bytes > 0 and result.mfu > 0
    assert result.wall_s > 0 and result.extra["world_size"] == plan.world_size
