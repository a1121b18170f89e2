"""The DeepSpeed engine built from the emitted ``ds_config.json`` counts the plan's global batch, at TP 1 and
at TP 2 (AutoTP) on 2 gloo ranks. With AutoTP, DeepSpeed 0.19 takes the batch's data-parallel size from the
mpu, without one from the world size (TP ranks counted): the emitted ``train_batch_size`` is then rejected,
and left out DeepSpeed would count TP times the plan's batch. ``summary.md`` tells the script to pass
``mpu=deepspeed.utils.groups``, as done here."""

from __future__ import annotations

import pytest
from distributed import run_on_ranks

from autotune.emit import to_ds_config
from autotune.plan import ParallelPlan

pytest.importorskip("deepspeed")

_TOY_SPECS = {
    "use_default_specs": False,
    "layer_specs": [  # the toy model's layers for AutoTP (user's part)
        {"patterns": [r".*\.up_proj\.weight$"], "partition_type": "column"},
        {"patterns": [r".*\.down_proj\.weight$"], "partition_type": "row"},
    ],
}


def _engine_counters(rank: int, world_size: int, cfg: dict, tp: int, use_mpu: bool) -> dict:
    import deepspeed
    import torch
    from torch import nn

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no 30 s JIT build (PLATFORM.md)
    from deepspeed.utils import groups

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up_proj, self.down_proj = nn.Linear(16, 32), nn.Linear(32, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down_proj(torch.relu(self.up_proj(x)))

    torch.manual_seed(0)
    model = nn.Sequential(Block())
    kwargs = {}
    if tp > 1:
        cfg["tensor_parallel"]["partition_config"] = _TOY_SPECS
        if use_mpu:  # what summary.md says a script with AutoTP does
            deepspeed.init_distributed()
            groups._init_tp_mesh_device(tensor_model_parallel_size=tp)
            kwargs["mpu"] = groups
    try:
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), config=cfg, **kwargs
        )
    except AssertionError as e:
        return {"rejected": str(e)}
    micro, accum = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    for i in range(accum):  # one optimizer step; every TP rank of a group sees the same micro-batch
        x = torch.randn(micro, 16, generator=torch.Generator().manual_seed(100 * (rank // tp) + i))
        engine.backward(engine(x.to(next(engine.parameters()).dtype)).float().sum())
        engine.step()
    return {
        "train_batch_size": engine.train_batch_size(),
        "global_samples": engine.global_samples,
        "global_steps": engine.global_steps,
        "dp": engine.dp_world_size,
    }


@pytest.mark.slow
@pytest.mark.dist(timeout=300)
@pytest.mark.parametrize(("tp", "sharding"), [(1, "zero1"), (2, "none")])  # 2 ranks: DP 2, or TP 2 x DP 1
def test_engine_counts_the_plans_global_batch(tp, sharding, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    plan = ParallelPlan(
        tp=tp,
        dp=2 // tp,
        micro_batch=1,
        global_batch=4 // tp,
        seq_len=64,
        sharding=sharding,
        framework="deepspeed",
    )
    cfg = to_ds_config(plan)
    assert cfg["train_batch_size"] == plan.global_batch
    counters = run_on_ranks(_engine_counters, 2, cfg, tp, True, timeout_s=240)[0]
    assert counters == {
        "train_batch_size": plan.global_batch,
        "global_samples": plan.global_batch,
        "global_steps": 1,
        "dp": plan.dp,
    }


@pytest.mark.slow
@pytest.mark.dist(timeout=300)
def test_autotp_without_an_mpu_rejects_the_plans_batch(monkeypatch):
    """Why summary.md asks for the mpu: DeepSpeed alone counts world size 2 where DP is 1."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    plan = ParallelPlan(tp=2, dp=1, micro_batch=1, global_batch=2, seq_len=64, framework="deepspeed")
    result = run_on_ranks(_engine_counters, 2, to_ds_config(plan), 2, False, timeout_s=240)[0]
    assert "gradient_acc_step * world_size 2 != 1 * 2 * 2" in result["rejected"]
