"""TP beyond the KV heads: Megatron-Core holds each K/V head on ``TP / KV heads`` ranks (megatron-core 0.16.1
``attention.py``, ``num_query_groups < world_size``), as NVIDIA's H100 recipe runs Nemotron 3 Super (2 KV
heads) at TP 8; torchtitan and DeepSpeed AutoTP split the K/V heads and need TP to divide them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate
from autotune.costmodel.tpcomm import kv_replica_gather_s
from autotune.modelshape import attention_activation_width, kv_replicas
from autotune.plan import ParallelPlan, check_plan


def _plan(**kw):
    base = dict(tp=8, dp=2, ep=8, global_batch=64, seq_len=4096, sharding="zero1", sequence_parallel=True)
    return ParallelPlan(**{**base, "framework": "megatron", **kw})


def test_megatron_runs_tp_a_multiple_of_the_kv_heads_and_the_others_name_it():
    qwen, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16)  # 4 KV heads
    assert (kv_replicas(qwen, 4), kv_replicas(qwen, 8), kv_replicas(load_model("deepseek-v3"), 8)) == (
        1,
        2,
        1,
    )
    assert check_plan(_plan(), qwen, cluster) == []
    fsdp = _plan(framework="fsdp", sharding="fsdp-full", sequence_parallel=False)
    assert check_plan(fsdp, qwen, cluster) == [
        "TP 8 does not divide KV heads 4 (Megatron replicates them over TP: --framework megatron)"
    ]
    odd = dataclasses.replace(qwen, num_kv_heads=16, num_heads=48)  # TP 32 / 16 fine; 48 heads, 6 KV: not
    assert check_plan(_plan(tp=8), dataclasses.replace(odd, num_kv_heads=6), cluster) == [
        "TP 8 neither divides nor is a multiple of KV heads 6"
    ]


def test_each_rank_keeps_its_groups_k_and_v_and_gathers_the_qkv_output():
    qwen, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16)
    kv = qwen.kv_hidden_size
    assert attention_activation_width(qwen, 8) - attention_activation_width(qwen, 4) == 2 * kv  # per TP share
    tokens = 4096.0
    assert kv_replica_gather_s(qwen, cluster, _plan(tp=4, dp=4), tokens) == 0.0
    gather = kv_replica_gather_s(qwen, cluster, _plan(), tokens)
    assert gather > 0 and kv_replica_gather_s(qwen, cluster, _plan(recompute="full"), tokens) > gather
    at8 = estimate(qwen, cluster, _plan())
    eight = dataclasses.replace(qwen, num_kv_heads=8)  # each rank holds one K/V head either way ...
    assert at8.memory.activations_bytes == estimate(eight, cluster, _plan()).memory.activations_bytes
    assert at8.time.tp_comm_s > estimate(eight, cluster, _plan()).time.tp_comm_s  # ... but gathers QKV


def test_nvidias_h100_layout_of_nemotron_3_super_is_legal_and_fits_with_its_bf16_gradients():
    """Megatron-Bridge recipes/nemotronh/h100/nemotron_3_super.py: TP 8, EP 16, SP, seq 8192, mbs 1, gbs
    1024, bf16 gradient reduction (grad_reduce_in_fp32 False) on 64 H100."""
    super_, cluster = load_model("nemotron-3-super-120b-a12b"), make_cluster(num_gpus=64)
    plan = _plan(dp=8, ep=16, global_batch=1024, seq_len=8192, grad_reduce_dtype="bf16")
    assert check_plan(plan, super_, cluster) == []
    est = estimate(super_, cluster, plan)
    assert est.feasible and est.memory.needed_bytes < cluster.gpu.memory_bytes
    fsdp = plan.replace(
        framework="fsdp", sharding="fsdp-full", sequence_parallel=False, grad_reduce_dtype=None
    )
    assert "TP 8 does not divide KV heads 2" in check_plan(fsdp, super_, cluster)[0]


def test_megatrons_ulysses_splits_a_ranks_kv_heads_over_cp():
    """Transformer Engine's a2a context parallelism asserts a rank's K heads divide by CP (context_parallel.py
    ``AttnFuncWithCPAndQKVOA2A``): Llama 3 8B at TP 4 holds 2 KV heads per rank (CP 2 fine), at TP 8 one."""
    llama, cluster = load_model("llama3-8b"), make_cluster(num_gpus=16)
    a2a = dict(dp=1, ep=1, cp=2, cp_comm="a2a", sequence_parallel=True)
    assert check_plan(_plan(tp=4, **{**a2a, "dp": 2}), llama, cluster) == []
    assert check_plan(_plan(tp=8, **a2a), llama, cluster) == [
        "cp-comm a2a: CP 2 does not divide a rank's 1 KV head(s) (TE); use p2p"
    ]


def test_deepspeeds_ulysses_needs_a_kv_head_per_rank_as_its_own_check_says():
    """DeepSpeed-Ulysses partitions by KV group and asserts at least one KV head per sequence-parallel rank
    (``deepspeed.sequence.layer._resolve_kv_heads``): Llama 3 8B (32 heads, 8 KV) runs at CP 8, not 16,
    though 16 divides its 32 query heads. The rule is asked of DeepSpeed itself."""
    layer = pytest.importorskip("deepspeed.sequence.layer")
    llama, cluster = load_model("llama3-8b"), make_cluster(num_gpus=16)
    ds = dict(framework="deepspeed", sharding="zero1", tp=1, ep=1, cp_comm="a2a", sequence_parallel=False)
    for cp, ok in ((8, True), (16, False)):
        keys = torch.empty(1, 4, llama.num_kv_heads, 2)  # [batch, local sequence, KV heads, head dim]
        try:
            layer._resolve_kv_heads(keys, 2, cp, llama.num_kv_heads)
            runs = True
        except AssertionError:
            runs = False
        errors = check_plan(_plan(**ds, cp=cp, dp=16 // cp), llama, cluster)
        assert runs is ok and (errors == []) is ok, (cp, errors)
    assert errors == ["DeepSpeed-Ulysses needs CP 16 <= KV heads 8; lower --cp"]
