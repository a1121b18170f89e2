"""Offload in the step time: host<->device traffic per framework (``offload.host_traffic``) and what of it
stays exposed (``steptime._offload_s``). Split out of test_steptime.py."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import estimate
from autotune.costmodel.offload import PCIE_BYTES_PER_S, HostTraffic, host_traffic
from autotune.costmodel.steptime import step_time
from autotune.plan import ParallelPlan


def test_fsdp_offload_copies_the_param_shard_in_every_microbatch():
    """FSDP2 CPUOffloadPolicy: each micro-batch copies the fp32 param shard host->GPU before its forward and
    backward all-gathers; 256 micro-batches of a 4.3B-param shard cannot hide behind their compute. (No PP:
    a pipelined 70B FSDP2 stage keeps its unsharded fp32 gradients on the GPU and fits no H200.)"""
    model = load_model("70b")
    plan = ParallelPlan(cp=4, dp=4, global_batch=1024, seq_len=4096, sharding="fsdp-full", offload=True)
    t = step_time(model, make_cluster(num_gpus=16), plan)
    shard = model.num_params / (plan.dp * plan.cp)
    assert t.offload_s >= plan.num_microbatches * shard * 4 / PCIE_BYTES_PER_S  # fp32 shard, one gather each
    half = step_time(model, make_cluster(num_gpus=16), plan.replace(global_batch=512))
    assert t.offload_s > 1.9 * half.offload_s  # per-micro-batch traffic, not per step
    h200 = make_cluster(num_gpus=16, gpu="h200")  # 141 GB: the plan fits with its states on the GPU too
    offloaded, on_gpu = estimate(model, h200, plan), estimate(model, h200, plan.replace(offload=False))
    assert offloaded.feasible and on_gpu.feasible
    assert offloaded.step_time_s > 2 * on_gpu.step_time_s


def test_offload_traffic_per_framework_scales_as_documented():
    plan = ParallelPlan(
        dp=16, global_batch=16, seq_len=4096, sharding="zero2", framework="deepspeed", offload=True
    )
    shard = 1e9
    # one micro-batch: fp32 gradient partition down (4 B), 16-bit parameter partition up (2 B), once
    assert host_traffic(plan, shard) == HostTraffic(0.0, 0.0, 6 * shard, 0.0)
    for m in (2, 8, 64):  # accumulation round-trips the 16-bit partition through the pinned host buffer
        t = host_traffic(plan.replace(global_batch=16 * m), shard)
        assert t == HostTraffic(
            overlapped_h2d_bytes=(m - 1) * 2 * shard,
            overlapped_d2h_bytes=m * 2 * shard,
            step_bytes=6 * shard,
            host_accumulate_bytes=0.0,
        )
        assert host_traffic(plan.replace(global_batch=16 * m, sharding="zero3"), shard) == t
        zero1 = host_traffic(plan.replace(global_batch=16 * m, sharding="zero1"), shard)
        assert zero1 == HostTraffic(0.0, 0.0, 10 * shard, 0.0)  # reduced (and round-tripped) at the boundary
        megatron = plan.replace(global_batch=16 * m, sharding="zero1", framework="megatron")
        assert host_traffic(megatron, shard) == HostTraffic(0.0, 0.0, 6 * shard, 0.0)
        fsdp = host_traffic(plan.replace(global_batch=16 * m, sharding="fsdp-full", framework="fsdp"), shard)
        assert fsdp == HostTraffic(
            overlapped_h2d_bytes=m * 8 * shard,
            overlapped_d2h_bytes=m * 4 * shard,
            step_bytes=0.0,
            host_accumulate_bytes=(m - 1) * 12 * shard,
        )
    assert host_traffic(plan.replace(offload=False), shard) == HostTraffic(0.0, 0.0, 0.0, 0.0)
    # 13B over 16 GPUs: the 1.6 GB per-micro-batch round trip hides behind 0.5 s of compute but for the
    # first bucket; the once-per-step copies never hide
    model, cluster = load_model("13b"), make_cluster(num_gpus=16)
    step_s = 6 * model.num_params / 16 / PCIE_BYTES_PER_S
    one = step_time(model, cluster, plan)
    eight = step_time(model, cluster, plan.replace(global_batch=128))
    assert one.offload_s == pytest.approx(step_s)
    assert step_s < eight.offload_s < 1.1 * step_s
