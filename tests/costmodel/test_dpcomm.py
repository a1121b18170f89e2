"""Tier 1: which DP collectives each framework issues for each sharding (dpcomm.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import comm, moe
from autotune.costmodel.dpcomm import (
    GRAD_REDUCE_BYTES,
    PARAM_GATHER_BYTES,
    collective_calls,
    dp_comm_s,
    expert_dp_split,
)
from autotune.costmodel.states import megatron_grad_bytes
from autotune.costmodel.steptime import step_time
from autotune.plan import ParallelPlan


@pytest.mark.parametrize("sharding", ["zero1", "zero2"])
def test_deepspeed_all_reduces_its_gradient_buckets_megatron_reduce_scatters(sharding):
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    params = model.num_params
    link = comm.group_link(cluster, 8, 1)
    others = [("megatron", comm.reduce_scatter_s)] if sharding == "zero1" else []  # Megatron has no ZeRO-2
    for framework, grads in [("deepspeed", comm.allreduce_s), *others]:
        plan = ParallelPlan(
            dp=8, global_batch=16, micro_batch=1, seq_len=2048, sharding=sharding, framework=framework
        )
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


def test_deepspeed_zero3_keeps_small_parameters_and_fetches_the_rest_every_micro_batch():
    from autotune.costmodel.dpcomm import DEEPSPEED_PERSISTENCE_ELEMENTS, zero3_gathers

    model = load_model("70b")
    g = zero3_gathers(model, 1)
    # at 70B only the norms are under DeepSpeed's persistence threshold: two per block and the final one
    assert g.persistent == 2 * model.num_layers + 1
    assert g.persistent_params + g.fetched_params == pytest.approx(model.num_params)
    # Q, K + V, O and each MLP matrix per block (each over the 5e7-element prefetch bucket but K + V), the
    # embedding and the head
    assert g.fetch_calls == 6 * model.num_layers + 2
    # TP shrinks the projections, and small's MLP matrices fall under the threshold and stay gathered;
    # AutoTP keeps the embedding and head whole, so they are fetched at any TP
    tiny, small = load_model("tiny"), load_model("small")
    assert small.hidden_size * small.ffn_hidden_size > DEEPSPEED_PERSISTENCE_ELEMENTS
    assert zero3_gathers(small, 2).persistent == zero3_gathers(small, 1).persistent + 3 * small.num_layers
    for tp in (1, 2, 4):
        assert zero3_gathers(tiny, tp).fetched_params == 2 * tiny.vocab_size * tiny.hidden_size

    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")
    one = ParallelPlan(
        dp=8, global_batch=8, micro_batch=1, seq_len=2048, sharding="zero3", framework="deepspeed"
    )
    two = one.replace(global_batch=16)
    params = model.num_params
    d1, d2 = (dp_comm_s(cluster, model, p, params, model.num_layers) for p in (one, two))
    link = comm.group_link(cluster, 8, 1)
    kept = comm.allgather_s(g.persistent_params * PARAM_GATHER_BYTES, 8, link, g.persistent)
    assert d1.tail_s == pytest.approx(kept) == d2.tail_s  # once per step, after the optimizer
    fetch = comm.allgather_s(g.fetched_params * PARAM_GATHER_BYTES, 8, link, g.fetch_calls)
    buckets = collective_calls(model, one, params, model.num_layers)[1]
    reduce = comm.reduce_scatter_s(params * GRAD_REDUCE_BYTES["deepspeed"], 8, link, buckets)
    # 70B is over the reuse distance (1e9 elements): backward fetches again
    assert d1.per_microbatch_s == pytest.approx(2 * fetch + reduce) == d2.per_microbatch_s
    assert step_time(model, cluster, two).dp_comm_total_s > step_time(model, cluster, one).dp_comm_total_s


def test_megatron_buckets_grow_with_the_dp_x_cp_group():
    """Megatron's default bucket is ``max(40M, 1M x dp_cp)`` elements (DistributedDataParallelConfig
    ``bucket_size``): at DP 448 a 7.3B-parameter rank reduces in 17 buckets, not 183, and pays the ring
    latency 17 times."""
    model = load_model("gpt3-175b")
    params = 7.3e9
    small = ParallelPlan(
        tp=4, pp=6, dp=16, global_batch=96, micro_batch=1, seq_len=2048, framework="megatron"
    )
    large = small.replace(dp=448, global_batch=2688)
    with_cp = small.replace(dp=224, cp=2, global_batch=1344)
    assert collective_calls(model, small, params, 16) == (183, 183)  # 40M floor: 16 ranks x 1M < 40M
    assert collective_calls(model, large, params, 16) == (17, 17)  # 448M elements per bucket
    assert collective_calls(model, with_cp, params, 16) == (17, 17)  # over DP x CP


def test_megatron_reduces_routed_experts_over_the_expert_data_parallel_group():
    """Megatron keeps routed-expert parameters in their own DDP buffers, reduced and (distributed optimizer)
    gathered over the expert-data-parallel group: ``expert_dp`` ranks at stride ``ep x etp``. The dense rest
    goes over DP x CP at stride TP, as for a dense model."""
    model = load_model("mixtral-8x7b")
    cluster = make_cluster(num_gpus=64, gpu="h100-sxm")
    plan = ParallelPlan(
        tp=2,
        dp=32,
        ep=8,
        global_batch=256,
        micro_batch=1,
        seq_len=4096,
        sharding="zero1",
        framework="megatron",
    )
    params = moe.expert_params_per_gpu(model, plan, model.num_layers) + 1e9
    dense, experts = expert_dp_split(model, plan, params, model.num_layers)
    assert experts == pytest.approx(moe.expert_params_per_gpu(model, plan, model.num_layers))
    assert dense + experts == pytest.approx(params) and dense > 0
    grad = megatron_grad_bytes(plan)  # Megatron's main_grad dtype (fp32 for a bf16 plan)
    total = 0.0
    for part, size, link in [
        (dense, 32, comm.group_link(cluster, 32, 2)),
        (experts, plan.expert_shard_degree, comm.group_link(cluster, plan.expert_shard_degree, 8)),
    ]:
        gathers, reduces = collective_calls(model, plan, part, model.num_layers)
        total += comm.reduce_scatter_s(part * grad, size, link, reduces)
        total += comm.allgather_s(part * PARAM_GATHER_BYTES, size, link, gathers)
    dp = dp_comm_s(cluster, model, plan, params, model.num_layers)
    assert dp.once_s + dp.tail_s == pytest.approx(total)
    # EP 1 and DeepSpeed keep one group
    for other in (plan.replace(ep=1), plan.replace(tp=1, dp=64, framework="deepspeed")):
        assert expert_dp_split(model, other, params, model.num_layers) == (params, 0.0)


def test_torchtitan_shards_each_block_s_experts_over_the_efsdp_group():
    """torchtitan wraps each block's experts in their own ``fully_shard`` over the sparse mesh's ``efsdp``
    dimension (``pp, dp_replicate, efsdp, ep, etp``): ``shard x cp x tp / (ep x etp)`` ranks at stride
    ``ep x etp``, one more unit per MoE block; the dense rest over the shard group at stride TP."""
    model = load_model("mixtral-8x7b")
    cluster = make_cluster(num_gpus=64, gpu="h100-sxm")
    plan = ParallelPlan(
        dp=64, ep=8, global_batch=128, micro_batch=1, seq_len=4096, sharding="fsdp-full", framework="fsdp"
    )
    params = moe.expert_params_per_gpu(model, plan, model.num_layers) + 1e9
    dense, experts = expert_dp_split(model, plan, params, model.num_layers)
    assert experts > 0 and dense == pytest.approx(1e9)
    gathers, reduces = collective_calls(model, plan, dense, model.num_layers)
    dense_link, expert_link = comm.group_link(cluster, 64, 1), comm.group_link(cluster, 8, 8)
    assert expert_link.num_nodes == 8  # one expert replica per node: every hop on the network
    units = model.num_layers  # every Mixtral block is an MoE block
    gather = comm.allgather_s(dense * PARAM_GATHER_BYTES, 64, dense_link, gathers) + comm.allgather_s(
        experts * PARAM_GATHER_BYTES, 8, expert_link, units
    )
    grad = GRAD_REDUCE_BYTES["fsdp"]
    reduce = comm.reduce_scatter_s(dense * grad, 64, dense_link, reduces) + comm.reduce_scatter_s(
        experts * grad, 8, expert_link, units
    )
    dp = dp_comm_s(cluster, model, plan, params, model.num_layers)
    assert dp.per_microbatch_s == pytest.approx(2 * gather + reduce)
