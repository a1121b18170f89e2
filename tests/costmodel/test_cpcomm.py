"""Context-parallel exchange in the block time (``cpcomm.cp_exposed_s``): Megatron's ring and torch's
``context_parallel``, hidden behind attention where the device has streams. Split out of test_steptime.py."""

import dataclasses

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import comm, compute, cpcomm
from autotune.costmodel.blocktime import block_times
from autotune.plan import ParallelPlan


def test_context_parallel_exchange_hides_behind_long_attention():
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    plan = ParallelPlan(cp=8, dp=1, global_batch=1, seq_len=8192, framework="megatron")
    short = block_times(model, cluster, plan)
    long = block_times(model, cluster, plan.replace(seq_len=131072))
    # fully hidden at 128k: what is left is the SMs NCCL's send/recv holds meanwhile (``ncclsm``)
    blind = dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, sm_count=None))
    assert short.cp_s > 0 and block_times(model, blind, plan.replace(seq_len=131072)).cp_s == 0.0
    assert 0 < long.cp_s < 0.01 * long.total_s


def test_ring_attention_transfers_block_on_a_device_without_streams():
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    plan = ParallelPlan(cp=2, global_batch=4, micro_batch=2, seq_len=64, framework="megatron")
    blocked = block_times(model, cpu, plan).cp_s
    streams = dataclasses.replace(cpu, gpu=dataclasses.replace(cpu.gpu, async_collectives=True))
    assert blocked > block_times(model, streams, plan).cp_s >= 0
    # forward passes K and V once around the ring, backward K, V and their gradients: 3 passes, all exposed
    link = comm.group_link(cpu, 2, 1)
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    one_pass = comm.p2p_s(2 * tokens * model.kv_hidden_size * cpu.gpu.half_bytes, link)
    assert blocked == pytest.approx(3 * one_pass)


def test_torch_ring_adds_fp32_gradient_rotation_and_merges():
    # torch context_parallel (torchtitan): K/V once each way, fp32 dK/dV after each of the cp steps, plus
    # the fp32 merges and gradient accumulation at HBM bandwidth (cpcomm.torch_ring_s)
    model = load_model("tiny")
    cpu = make_cluster(num_gpus=2, gpu="cpu")
    plan = ParallelPlan(cp=2, global_batch=4, micro_batch=2, seq_len=64, framework="fsdp", recompute="none")
    link = comm.group_link(cpu, 2, 1)
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    kv_elems = 2 * tokens * model.kv_hidden_size
    out_elems = tokens * model.hidden_size
    hbm = out_elems * cpcomm.MERGE_BYTES + 2 * (
        out_elems * cpcomm.GRAD_ACC_BYTES[0] + kv_elems * cpcomm.GRAD_ACC_BYTES[1]
    )
    expected = (
        2 * comm.p2p_s(kv_elems * cpu.gpu.half_bytes, link)
        + 2 * comm.p2p_s(4 * kv_elems, link)
        + hbm / compute.hbm_rate(cpu)
    )
    assert block_times(model, cpu, plan).cp_s == pytest.approx(expected)
    megatron = block_times(model, cpu, plan.replace(framework="megatron")).cp_s
    assert megatron < expected
    # full recompute re-runs the forward merges
    full = block_times(model, cpu, plan.replace(recompute="full")).cp_s
    assert full == pytest.approx(expected + out_elems * cpcomm.MERGE_BYTES / compute.hbm_rate(cpu))
