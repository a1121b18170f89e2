"""Tier 1: the host-operator counts of the cost model are those the trial model dispatches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.hostops import (
    ATTENTION_CORE_FWD_OPS,
    BLOCK_OPS,
    EDGE_OPS,
    TP_BLOCK_OPS,
    TP_EDGE_OPS,
    block_host_s,
    block_ops,
    edge_host_s,
    fsdp_host_s,
    tp_block_calls,
    tp_block_ops,
    zero3_host_s,
)
from autotune.costmodel.steptime import step_time
from autotune.costmodel.tpcomm import collective_calls
from autotune.plan import ParallelPlan
from autotune.probe.overhead import count_ops
from autotune.trials.model import Block, build_model
from autotune.trials.train import lm_loss


def _with_host(gpu, **fields):
    """``gpu`` with these host-profile figures replaced."""
    return dataclasses.replace(gpu, host=dataclasses.replace(gpu.host, **fields))


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
    h100 = make_cluster(num_gpus=8, gpu="h100-sxm").gpu
    assert catalog.gpu.host.op_overhead_s > 0 == h100.host.op_overhead_s
    base = dataclasses.replace(catalog, gpu=_with_host(catalog.gpu, op_overhead_s=0.0))
    cpu = dataclasses.replace(base, gpu=_with_host(base.gpu, op_overhead_s=10e-6))
    plan = ParallelPlan(pp=2, global_batch=8, micro_batch=1, seq_len=64)
    bigger_mb = plan.replace(micro_batch=2)
    added = [
        step_time(model, cpu, p).overhead_s - step_time(model, base, p).overhead_s for p in (plan, bigger_mb)
    ]
    assert added[0] == pytest.approx(2 * added[1])  # half the micro-batches, half the operators
    blocks = model.num_layers // 2
    ops = plan.num_microbatches * (blocks * block_ops(model, plan) + EDGE_OPS)
    assert added[0] == pytest.approx(ops * 10e-6)
    full = plan.replace(recompute="full")
    assert block_ops(model, full) == block_ops(model, plan) + BLOCK_OPS[True][0]
    assert step_time(model, base, plan).step_time_s < step_time(model, cpu, plan).step_time_s


def test_dtensor_operators_are_charged_to_torch_tp_only():
    model = load_model("tiny")
    catalog = make_cluster(num_gpus=2, gpu="cpu")
    assert catalog.gpu.host.dtensor_op_overhead_s > catalog.gpu.host.op_overhead_s > 0
    assert make_cluster(num_gpus=8, gpu="h100-sxm").gpu.host.dtensor_op_overhead_s == 0
    tp = ParallelPlan(tp=2, global_batch=4, micro_batch=2, seq_len=64)
    plain, dtensor = tp_block_ops(model, tp)
    fp, fd, bp, bd = TP_BLOCK_OPS[True, False]
    assert (plain, dtensor) == (fp + bp, fd + bd)
    assert block_host_s(model, catalog, tp) == pytest.approx(
        plain * catalog.gpu.host.op_overhead_s
        + dtensor * catalog.gpu.host.dtensor_op_overhead_s
        + 4 * catalog.gpu.host.dtensor_collective_overhead_s
    )
    # sequence parallelism runs more of the block on DTensors: more host time per micro-batch
    sp = tp.replace(sequence_parallel=True)
    assert block_host_s(model, catalog, sp) > block_host_s(model, catalog, tp)
    assert step_time(model, catalog, sp).overhead_s > step_time(model, catalog, tp).overhead_s
    # a recomputed forward replays its DTensor operators; selective recompute replays local ones only
    assert tp_block_ops(model, tp.replace(recompute="full"))[1] == dtensor + fd
    assert tp_block_ops(model, tp.replace(recompute="selective")) == (plain + ATTENTION_CORE_FWD_OPS, dtensor)
    # Megatron and DeepSpeed TP do not use DTensors
    for framework in ("megatron", "deepspeed"):
        other = tp.replace(framework=framework)
        assert block_host_s(model, catalog, other) == block_ops(model, other) * catalog.gpu.host.op_overhead_s
    assert sum(TP_EDGE_OPS[True, True]) > sum(TP_EDGE_OPS[True, False]) > 0


def test_tp_collectives_through_dtensor_are_charged_once_each():
    """Blocks and edges together charge ``dtensor_collective_overhead_s`` once per TP collective call that
    ``tpcomm.collective_calls`` counts (itself checked against CommDebugMode in test_tp_comm)."""
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    gpu = _with_host(
        cpu.gpu, op_overhead_s=0.0, dtensor_op_overhead_s=0.0, dtensor_collective_overhead_s=1e-3
    )
    cluster = dataclasses.replace(cpu, gpu=gpu)
    assert make_cluster(num_gpus=2, gpu="cpu").gpu.host.dtensor_collective_overhead_s > 0
    assert make_cluster(num_gpus=8, gpu="h100-sxm").gpu.host.dtensor_collective_overhead_s == 0
    for sp in (False, True):
        for recompute in ("none", "full"):
            plan = ParallelPlan(
                tp=2, global_batch=4, micro_batch=2, seq_len=64, sequence_parallel=sp, recompute=recompute
            )
            blocks = model.num_layers * block_host_s(model, cluster, plan)
            charged = blocks + edge_host_s(model, cluster, plan)
            assert charged == pytest.approx(sum(collective_calls(model, plan)) * 1e-3)
            assert tp_block_calls(model, plan) == (4 if recompute == "none" else 6) * (2 if sp else 1)
    for framework in ("megatron", "deepspeed"):  # no DTensors: nothing charged
        plan = ParallelPlan(tp=2, global_batch=4, micro_batch=2, seq_len=64, framework=framework)
        assert block_host_s(model, cluster, plan) == edge_host_s(model, cluster, plan) == 0
    # one cost for every kind: with SP a reduction is two calls (an all-gather and a reduce-scatter)
    plan = ParallelPlan(tp=2, global_batch=4, micro_batch=2, seq_len=64)
    assert block_host_s(model, cluster, plan) == pytest.approx(4 * 1e-3)
    assert edge_host_s(model, cluster, plan) == pytest.approx(2 * 1e-3 + 1e-3)  # embedding, head; logits
    sp = plan.replace(sequence_parallel=True)
    assert block_host_s(model, cluster, sp) == pytest.approx(4 * 2e-3)
    assert edge_host_s(model, cluster, sp) == pytest.approx(2 * 2e-3 + 1e-3)


def test_deepspeed_zero3_host_time_per_module_and_parameter_byte():
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    gpu = cpu.gpu
    assert gpu.host.zero3_host_module_s > 0 and gpu.host.zero3_host_bytes_per_s > 0
    assert make_cluster(num_gpus=8, gpu="h100-sxm").gpu.host.zero3_host_module_s == 0
    zero3 = ParallelPlan(
        dp=2, global_batch=4, micro_batch=1, seq_len=64, framework="deepspeed", sharding="zero3"
    )
    params = model.num_params
    # per module and per parameter byte, in each of the 2 micro-batches
    host = gpu.host
    expected = 2 * (39 * host.zero3_host_module_s + params * gpu.half_bytes / host.zero3_host_bytes_per_s)
    assert zero3_host_s(cpu, zero3, 39, params) == pytest.approx(expected)
    assert zero3_host_s(cpu, zero3.replace(micro_batch=2), 39, params) == pytest.approx(expected / 2)
    # in the step: the modules dpcomm.zero3_gathers counts, on top of ZeRO-2's overhead
    zero2 = zero3.replace(sharding="zero2")
    added = step_time(model, cpu, zero3).overhead_s - step_time(model, cpu, zero2).overhead_s
    assert added == pytest.approx(expected)
    # FSDP's fully_shard and DeepSpeed's other stages pay none of it
    for other in (zero2, zero3.replace(framework="fsdp", sharding="fsdp-full")):
        assert zero3_host_s(cpu, other, 39, params) == 0


def test_fsdp2_host_time_per_wrapped_unit_and_micro_batch():
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    gpu = cpu.gpu
    assert gpu.host.fsdp_host_unit_s > 0 and gpu.host.fsdp_host_bytes_per_s > 0
    assert make_cluster(num_gpus=8, gpu="h100-sxm").gpu.host.fsdp_host_unit_s == 0
    plan = ParallelPlan(dp=2, global_batch=8, micro_batch=2, seq_len=64, sharding="fsdp-full")
    units, params = model.num_layers + 2, model.num_params  # a unit per block and per end (untied)
    per_byte = params * gpu.half_bytes / gpu.host.fsdp_host_bytes_per_s
    per_mb = units * gpu.host.fsdp_host_unit_s + per_byte
    assert fsdp_host_s(cpu, plan, units, params) == pytest.approx(2 * per_mb)  # 2 micro-batches per rank
    # in the step: on top of the same plan without it, for replicate (sharding none: per block, then the
    # root) as for fully_shard
    for sharding, wrapped in (("none", units - 1), ("fsdp-grad-op", units), ("fsdp-full", units)):
        p = plan.replace(sharding=sharding)
        without = dataclasses.replace(
            cpu, gpu=_with_host(gpu, fsdp_host_unit_s=0.0, fsdp_host_bytes_per_s=0.0)
        )
        added = step_time(model, cpu, p).overhead_s - step_time(model, without, p).overhead_s
        assert added == pytest.approx(2 * (wrapped * gpu.host.fsdp_host_unit_s + per_byte))
    # nothing to wrap on one rank, and DeepSpeed has its own hooks
    assert fsdp_host_s(cpu, ParallelPlan(pp=2, global_batch=8, micro_batch=2, seq_len=64), units, params) == 0
    assert fsdp_host_s(cpu, plan.replace(framework="deepspeed", sharding="zero3"), units, params) == 0
