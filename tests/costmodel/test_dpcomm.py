"""Tier 1: which DP collectives each framework issues for each sharding (dpcomm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import comm
from autotune.costmodel.dpcomm import GRAD_REDUCE_BYTES, PARAM_GATHER_BYTES, collective_calls, dp_comm_s
from autotune.costmodel.steptime import step_time
from autotune.plan import ParallelPlan


@pytest.mark.parametrize("sharding", ["zero1", "zero2"])
def test_deepspeed_all_reduces_its_gradient_buckets_megatron_reduce_scatters(sharding):
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    params = model.num_params
    link = comm.group_link(cluster, 8, 1)
    others = [("megatron", comm.reduce_scatter_s)] if sharding == "zero1" else []  # Megatron has no ZeRO-2
    for framework, grads in [("deepspeed", comm.allreduce_s), *others]:
        plan = ParallelPlan(dp=8, global_batch=16, micro_batch=1, seq_len=2048, sharding=sharding,
                            framework=framework)
        gathers, reduces = collective_calls(model, plan, params, model.num_layers)
        grads_s = grads(params * GRAD_REDUCE_BYTES[framework], 8, link, reduces)
        params_s = comm.allgather_s(params * PARAM_GATHER_BYTES, 8, link, gathers)
        dp = dp_comm_s(cluster, model, plan, params, model.num_layers)
        total = dp.per_microbatch_s + dp.once_s + dp.tail_s
        if sharding == "zero2":  # ZeRO-2 reduces in every micro-batch's backward, then gathers after the step
            assert dp.per_microbatch_s == pytest.approx(grads_s) and dp.tail_s == pytest.approx(params_s)
        elif framework == "deepspeed":  # ZeRO-1 reduces after the last backward: nothing to hide behind
            assert dp.tail_s == pytest.approx(grads_s + params_s) == total
        else:  # Megatron's distributed optimizer reduces its buckets during the last backward
            assert dp.once_s == pytest.approx(grads_s + params_s) == total


def test_deepspeed_zero0_reduces_after_backward_and_fsdp_replicate_in_it():
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    params = model.num_params
    plan = ParallelPlan(dp=8, global_batch=16, micro_batch=1, seq_len=2048, framework="deepspeed")
    ds = dp_comm_s(cluster, model, plan, params, model.num_layers)
    assert ds.tail_s > 0 and ds.once_s == ds.per_microbatch_s == 0
    fsdp = dp_comm_s(cluster, model, plan.replace(framework="fsdp"), params, model.num_layers)
    assert fsdp.per_microbatch_s > 0 and fsdp.tail_s == 0
    # exposed: DeepSpeed's reduction costs the whole all-reduce, FSDP2's hides behind backward
    ds_step, fsdp_step = (step_time(model, cluster, p) for p in (plan, plan.replace(framework="fsdp")))
    assert ds_step.dp_comm_s == pytest.approx(ds.tail_s)
    assert fsdp_step.dp_comm_s < fsdp.per_microbatch_s


def test_collectives_block_compute_on_a_device_without_streams():
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    assert not cpu.gpu.async_collectives and make_cluster(num_gpus=8, gpu="h100-sxm").gpu.async_collectives
    plan = ParallelPlan(dp=2, global_batch=4, micro_batch=1, seq_len=64, sharding="fsdp-full")
    measured_overlap = dataclasses.replace(cpu, dp_overlap_fraction=0.9)  # a probe's gloo overlap
    for cluster in (cpu, measured_overlap):
        t = step_time(model, cluster, plan)
        assert t.dp_comm_s == pytest.approx(t.dp_comm_total_s)  # every collective exposed
    streams = dataclasses.replace(cpu.gpu, async_collectives=True)
    on_streams = dataclasses.replace(measured_overlap, gpu=streams)
    assert step_time(model, on_streams, plan).dp_comm_s < step_time(model, cpu, plan).dp_comm_s
