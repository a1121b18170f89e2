"""Tier 1: the host-operator counts of the cost model are those the trial model dispatches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.hostops import ATTENTION_CORE_FWD_OPS, BLOCK_OPS, EDGE_OPS, block_ops
from autotune.costmodel.steptime import step_time
from autotune.plan import ParallelPlan
from autotune.probe.overhead import count_ops
from autotune.trials.model import Block, build_model
from autotune.trials.train import lm_loss


def _whole_model_ops(spec) -> tuple[int, int]:
    """(forward, backward) operators of one micro-batch through the trial model, loss included."""
    whole = build_model(spec, device="cpu", seed=0)
    x = torch.randint(0, spec.vocab_size, (2, 16))
    holder: dict[str, torch.Tensor] = {}
    fwd = count_ops(lambda: holder.setdefault("loss", lm_loss(whole(x), x)))
    return fwd, count_ops(lambda: holder["loss"].backward())


@pytest.mark.parametrize("gated", [True, False])
def test_block_operator_counts_match_the_trial_model(gated):
    spec = dataclasses.replace(load_model("tiny"), gated_mlp=gated, bias=not gated, num_layers=2)
    (f2, b2), (f4, b4) = _whole_model_ops(spec), _whole_model_ops(dataclasses.replace(spec, num_layers=4))
    per_layer = ((f4 - f2) / 2, (b4 - b2) / 2)
    assert per_layer == BLOCK_OPS[gated]
    if gated:
        assert f2 + b2 - 2 * sum(per_layer) == EDGE_OPS
    core = Block(spec).self_attn.core
    q = torch.randn(1, 4, spec.hidden_size, requires_grad=True)
    assert count_ops(lambda: core(q, q, q)) == ATTENTION_CORE_FWD_OPS


def test_operator_time_is_charged_per_micro_batch_and_recompute():
    model = load_model("tiny")
    catalog = make_cluster(num_gpus=2, gpu="cpu")
    assert catalog.gpu.op_overhead_s > 0 == make_cluster(num_gpus=8, gpu="h100-sxm").gpu.op_overhead_s
    base = dataclasses.replace(catalog, gpu=dataclasses.replace(catalog.gpu, op_overhead_s=0.0))
    cpu = dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, op_overhead_s=10e-6))
    plan = ParallelPlan(pp=2, global_batch=8, micro_batch=1, seq_len=64)
    bigger_mb = plan.replace(micro_batch=2)
    added = [step_time(model, cpu, p).overhead_s - step_time(model, base, p).overhead_s
             for p in (plan, bigger_mb)]
    assert added[0] == pytest.approx(2 * added[1])  # half the micro-batches, half the operators
    blocks = model.num_layers // 2
    ops = plan.num_microbatches * (blocks * block_ops(model, plan) + EDGE_OPS)
    assert added[0] == pytest.approx(ops * 10e-6)
    full = plan.replace(recompute="full")
    assert block_ops(model, full) == block_ops(model, plan) + BLOCK_OPS[True][0]
    assert step_time(model, base, plan).step_time_s < step_time(model, cpu, plan).step_time_s
