"""Framework-kernel terms of the step-time model: TE comm+GEMM overlap SMs, torchao rowwise rescaling, async
TP under rowwise scales, Megatron's DP overlap flags and its CPU optimizer."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import compute, dpcomm, gemms
from autotune.costmodel.blocktime import block_times
from autotune.costmodel.offload import optimizer_s as _optimizer_s
from autotune.costmodel.steptime import (
    HOST_OPTIMIZER_BYTES_PER_S,
    OPTIMIZER_BYTES_PER_PARAM,
    TORCH_CPU_ADAMW_BYTES_PER_PARAM,
    step_time,
)
from autotune.plan import ParallelPlan


def _megatron(**kw) -> ParallelPlan:
    base = dict(
        tp=8,
        pp=1,
        dp=2,
        micro_batch=1,
        global_batch=64,
        seq_len=4096,
        sharding="zero1",
        sequence_parallel=True,
        framework="megatron",
    )
    return ParallelPlan(**(base | kw))


def test_te_overlap_slows_the_gemms_it_overlaps_by_the_sms_it_holds():
    model, cluster = load_model("70b"), make_cluster(num_gpus=16, gpu="a100-80gb")
    plan = _megatron(tp_comm_overlap=True)
    tokens = plan.micro_batch * plan.seq_len
    extra = compute.ub_sm_margin_s(model, cluster, plan, tokens)
    assert compute.ub_sm_margin_s(model, cluster, plan.replace(tp_comm_overlap=False), tokens) == 0.0
    # row-parallel forward (O, down) + column-parallel backward (2x QKV, gate/up) at 108 / (108 - 16)
    shapes = gemms.block_gemms(model, plan, tokens, fused=True)
    qkv, o, up, down = (compute.kernels.gemm_s(cluster.gpu, "bf16", g.m, g.n, g.k) for g in shapes)
    assert extra == pytest.approx((o + down + 2 * (qkv + up)) * (108 / 92 - 1))
    with_ub = block_times(model, cluster, plan).gemm_s
    without = block_times(model, cluster, plan.replace(tp_comm_overlap=False)).gemm_s
    assert with_ub == pytest.approx(without + extra / 3)


def test_rowwise_pays_backward_rescale_and_keeps_its_all_gathers_under_async_tp():
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=64)
    fsdp = dict(
        tp=8,
        pp=1,
        dp=8,
        micro_batch=4,
        global_batch=32,
        seq_len=8192,
        sharding="fsdp-full",
        sequence_parallel=True,
        framework="fsdp",
        precision="fp8",
        compile=True,
    )
    rowwise = ParallelPlan(**fsdp, fp8_recipe="rowwise")
    tensorwise = ParallelPlan(**fsdp, fp8_recipe="tensorwise")
    tokens = 4 * 8192
    shapes = gemms.block_gemms(model, rowwise, tokens, fused=False)
    assert compute.rowwise_rescale_bytes(rowwise, shapes) == pytest.approx(
        4 * sum(g.count * (g.m * g.k + g.n * g.k) for g in shapes)
    )
    assert compute.rowwise_rescale_bytes(tensorwise, shapes) == 0.0
    # async TP hides the forward all-gathers for tensorwise but not for rowwise (pytorch/pytorch#149990)
    tw_gain = (
        block_times(model, cluster, tensorwise).tp_s
        - block_times(model, cluster, tensorwise.replace(async_tp=True)).tp_s
    )
    rw_gain = (
        block_times(model, cluster, rowwise).tp_s
        - block_times(model, cluster, rowwise.replace(async_tp=True)).tp_s
    )
    assert 0 < rw_gain < tw_gain


def test_megatron_without_dp_overlap_flags_exposes_the_gather_and_the_reduction():
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8, gpu="b200")
    plan = ParallelPlan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch=2,
        global_batch=128,
        seq_len=8192,
        sharding="zero1",
        framework="megatron",
    )
    params = model.num_params
    both = dpcomm.dp_comm_s(cluster, model, plan, params, model.num_layers)
    no_gather = dpcomm.dp_comm_s(
        cluster, model, plan.replace(overlap_param_gather=False), params, model.num_layers
    )
    neither_plan = plan.replace(overlap_param_gather=False, overlap_grad_reduce=False)
    neither = dpcomm.dp_comm_s(cluster, model, neither_plan, params, model.num_layers)
    assert both.tail_s == 0.0 and neither.once_s == 0.0
    assert 0 < no_gather.tail_s < neither.tail_s == pytest.approx(both.once_s)
    assert (
        step_time(model, cluster, plan).step_time_s
        < step_time(model, cluster, plan.replace(overlap_param_gather=False)).step_time_s
    )


def test_megatron_cpu_offload_runs_torch_unfused_adamw():
    """The host step streams TORCH_CPU_ADAMW_BYTES_PER_PARAM for Megatron, the fused figure for DeepSpeed."""
    cluster = make_cluster(num_gpus=16, gpu="a100-80gb")
    plan, shard = _megatron(offload=True), 1e9
    node = 8 * shard / HOST_OPTIMIZER_BYTES_PER_S
    assert _optimizer_s(cluster, plan, shard) == pytest.approx(node * TORCH_CPU_ADAMW_BYTES_PER_PARAM)
    deepspeed = plan.replace(framework="deepspeed", sequence_parallel=False)
    assert _optimizer_s(cluster, deepspeed, shard) == pytest.approx(node * OPTIMIZER_BYTES_PER_PARAM)
    assert TORCH_CPU_ADAMW_BYTES_PER_PARAM > OPTIMIZER_BYTES_PER_PARAM


def test_torchtitan_op_sac_reruns_every_second_matmul_and_no_attention():
    # torchtitan _apply_op_sac: q, k, v, o, gate, up, down -> k, o, up recomputed; SDPA's output is saved
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    plan = ParallelPlan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch=2,
        global_batch=16,
        seq_len=8192,
        sharding="fsdp-full",
        framework="fsdp",
        recompute="selective",
        compile=True,
    )
    h, kv, f, tokens = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size, 2 * 8192
    unsaved = sum(
        compute.kernels.gemm_s(cluster.gpu, "bf16", tokens, n, k) for n, k in ((kv, h), (h, h), (f, h))
    )
    bt = block_times(model, cluster, plan)
    assert bt.recompute_s == pytest.approx(unsaved + bt.ew_s, rel=1e-9)
    assert bt.recompute_s < bt.gemm_s + bt.ew_s  # not a full forward: q, v, gate, down are saved
    megatron = block_times(
        model, cluster, plan.replace(framework="megatron", sharding="zero1", compile=False)
    )
    assert megatron.recompute_s == pytest.approx(megatron.attn_s)  # Megatron: the attention core only


def test_hidden_fsdp_collectives_slow_the_compute_by_the_sms_nccl_holds():
    from dataclasses import replace

    from autotune.costmodel import fsdpcopy, ncclsm

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    plan = ParallelPlan(
        tp=1,
        pp=1,
        dp=8,
        micro_batch=2,
        global_batch=16,
        seq_len=8192,
        sharding="fsdp-full",
        framework="fsdp",
        compile=True,
    )
    blind = replace(cluster, gpu=replace(cluster.gpu, sm_count=None))
    with_sms, without = step_time(model, cluster, plan), step_time(model, blind, plan)
    hidden = without.dp_comm_total_s - without.dp_comm_s
    assert hidden > 0
    copies = fsdpcopy.fsdp_copy_s(cluster, plan, model.num_params)  # FSDP2's copies, also GPU-only
    assert with_sms.dp_comm_s == pytest.approx(
        without.dp_comm_s + hidden * ncclsm.NCCL_OVERLAP_CTAS / 132 + copies
    )
    assert ncclsm.hidden_comm_sm_s(make_cluster(num_gpus=2, gpu="cpu"), hidden) == 0.0
