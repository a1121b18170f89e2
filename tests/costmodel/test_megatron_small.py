"""Megatron terms that weigh most on small and mid models (issue 22, ``small``): the eager fp32
vocab-parallel cross-entropy, and the equal pipeline chunks that leave the LM head on the last rank."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import compute, flops, lossbytes
from autotune.costmodel.blocktime import block_times
from autotune.costmodel.states import vocab_split
from autotune.plan import ParallelPlan


def _plan(**kw) -> ParallelPlan:
    base = dict(tp=2, dp=4, micro_batch=1, global_batch=16, seq_len=4096, sequence_parallel=True)
    return ParallelPlan(**(base | {"framework": "megatron"} | kw))


def test_megatron_loss_moves_its_fp32_passes_over_the_vocab_slice():
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    plan = _plan()
    tokens = plan.micro_batch * plan.seq_len
    loss_s = block_times(model, cluster, plan).head_s - 3 * compute.head_gemm_s(
        model, cluster, vocab_split(plan), tokens
    )
    # 40 B forward + 14 B backward per logit (cross_entropy.py), on V / tp logits per token
    per_logit = 40 + 14
    assert loss_s == pytest.approx(tokens * per_logit * model.vocab_size / 2 / compute.hbm_rate(cluster))
    assert lossbytes.loss_bytes_per_vocab(plan) > flops.LOGITS_BYTES_PER_VOCAB


def test_only_megatron_pays_the_eager_loss():
    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")
    fsdp = _plan(framework="fsdp", tp=1, dp=8, sharding="fsdp-full", sequence_parallel=False)
    assert lossbytes.loss_bytes_per_vocab(fsdp) == flops.LOGITS_BYTES_PER_VOCAB
    # the loss is a larger share of a small model's step: its head costs more relative to its blocks
    plan = _plan()
    share = {}
    for name in ("llama3-8b", "llama3-70b"):
        m = load_model(name)
        bt = block_times(m, cluster, plan)
        share[name] = bt.head_s / (m.num_layers * (bt.fwd_s + bt.bwd_s))
    assert share["llama3-8b"] > 2 * share["llama3-70b"]


def test_equal_chunks_leave_the_head_on_the_last_rank():
    # Nemotron-4 22B shape (40 layers, 256k vocab) at PP4 x VP10: one block per chunk, as Megatron cuts it
    from autotune.costmodel import pipeline

    plan = _plan(tp=2, pp=4, dp=1, global_batch=16, schedule="interleaved", virtual_stages=10)
    assert pipeline.rank_blocks(40, plan, 6.5) == (10, 10)
    assert pipeline.stage_split(40, 4, 6.5) == (5, 12)  # the head-balanced split Megatron does not make
    # an uneven count keeps the framework's split: --account-for-embedding/loss-in-pipeline-split, 9/10/10/9
    uneven = plan.replace(virtual_stages=1, schedule="1f1b")
    assert pipeline.rank_blocks(38, uneven, 6.5) == (9, 10)


def test_megatron_passes_over_its_whole_grad_buffer_once_per_step():
    from autotune.costmodel import gradbuffer
    from autotune.costmodel.offload import optimizer_s
    from autotune.costmodel.steptime import step_time

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    hbm = compute.hbm_rate(cluster)
    plan = _plan(tp=1, dp=8, sequence_parallel=False, sharding="zero1")
    # fp32 main_grad under bf16: zero (write), NaN-check norm (read), 1/dp scaling (read + write)
    assert gradbuffer.megatron_grad_buffer_s(cluster, plan, 1e9) == pytest.approx(4 * 4 * 1e9 / hbm)
    # no DP: nothing to scale before a collective; fp8 recipes reduce a bf16 buffer
    assert gradbuffer.megatron_grad_buffer_s(cluster, plan.replace(dp=1, sharding="none"), 1e9) == (
        pytest.approx(2 * 4 * 1e9 / hbm)
    )
    fp8 = plan.replace(precision="fp8", fp8_recipe="delayed")
    assert gradbuffer.megatron_grad_buffer_s(cluster, fp8, 1e9) == pytest.approx(4 * 2 * 1e9 / hbm)
    fsdp = _plan(framework="fsdp", tp=1, dp=8, sharding="fsdp-full", sequence_parallel=False)
    assert gradbuffer.megatron_grad_buffer_s(cluster, fsdp, 1e9) == 0.0
    # the whole buffer (all of the rank's parameters), not the optimizer's 1/dp shard
    whole = gradbuffer.megatron_grad_buffer_s(cluster, plan, model.num_params)
    expected = optimizer_s(cluster, plan, model.num_params / plan.dp) + whole
    assert step_time(model, cluster, plan).optimizer_s == pytest.approx(expected, rel=1e-6)
