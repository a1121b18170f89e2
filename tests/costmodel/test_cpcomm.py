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


def test_torchtitan_rings_kv_at_the_query_width():
    """torchtitan's models expand grouped K/V heads before SDPA (``repeat_kv``), so torch's ring moves and
    accumulates K/V at the query width: a GQA model's CP costs what its MHA twin's does, and 405B (128 query
    / 8 KV heads) rings 16x the grouped bytes. Was: the grouped width, which under-priced torchtitan's 405B
    CP2-CP8 rows of its Dec 2024 benchmark by another 9-19 points."""
    gqa = load_model("llama3-405b")
    mha = dataclasses.replace(gqa, num_kv_heads=gqa.num_heads)
    assert cpcomm.sdpa_kv_width(gqa) == 16 * gqa.kv_hidden_size
    cluster = make_cluster(num_gpus=64)
    plan = ParallelPlan(tp=8, cp=8, global_batch=1, seq_len=262144, framework="fsdp", sharding="fsdp-full")
    ring = [cpcomm.torch_ring_s(m, cluster, plan, 32768.0, 0.01, 0.02) for m in (gqa, mha)]
    assert ring[0] == pytest.approx(ring[1])


def test_cp_attention_holds_what_each_implementation_keeps():
    """cpbuffers: TE's p2p ring keeps every step's K/V and partial output until its output correction; its
    all-gather the gathered K/V; torch's ring (torchtitan) K/V at the query width, all chunks with the
    all-gather rotater, two with the all-to-all one, and fp32 gradient accumulators in backward."""
    from autotune.costmodel.cpbuffers import cp_attention_bytes

    model = load_model("llama3-70b")
    te = ParallelPlan(
        tp=8, cp=4, dp=1, global_batch=4, seq_len=131072, framework="megatron", sequence_parallel=True
    )
    tokens, q, kv = 131072 / 4 / 8, 64 * 128, 8 * 128
    assert cp_attention_bytes(model, te, 2) == pytest.approx(4 * tokens * (2 * kv + q) * 2)
    assert cp_attention_bytes(model, te.replace(cp_comm="allgather"), 2) == pytest.approx(
        4 * 2 * tokens * kv * 2
    )
    assert cp_attention_bytes(model, te.replace(cp=1, dp=4), 2) == 0.0
    torch_ring = te.replace(framework="fsdp", sharding="fsdp-full", dp=2, global_batch=8, cp=8, tp=4)
    gathered = cp_attention_bytes(model, torch_ring.replace(cp_comm="allgather"), 2)
    rotated = cp_attention_bytes(model, torch_ring, 2)
    assert gathered > rotated > 0


def test_cp_attention_of_mla_holds_its_unabsorbed_keys_and_values():
    """DeepSeek-V3 under CP: Megatron's MLA core runs with 192-wide keys and 128-wide values per head (128
    heads), not the hidden size over the heads."""
    from autotune.costmodel.cpbuffers import cp_attention_bytes

    plan = ParallelPlan(
        tp=8, cp=2, dp=4, global_batch=8, seq_len=8192, framework="megatron", sequence_parallel=True
    )
    tokens = 8192 / 2 / 8
    kv, out = 128 * (192 + 128), 128 * 128
    assert cp_attention_bytes(load_model("deepseek-v3"), plan, 2) == pytest.approx(
        2 * tokens * (kv + out) * 2
    )
