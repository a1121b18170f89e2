"""The host time a Megatron MoE layer exposes through its per-layer host sync (autotune.costmodel.moehost)."""

import itertools

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate, moehost
from autotune.costmodel.blocktime import block_times
from autotune.plan import ParallelPlan


def _plan(**kw):
    return ParallelPlan(
        **{
            "dp": 8,
            "ep": 8,
            "global_batch": 64,
            "seq_len": 4096,
            "framework": "megatron",
            "sharding": "zero1",
            **kw,
        }
    )


def test_operations_grow_with_local_experts_and_full_recompute():
    qwen = load_model("qwen3-30b-a3b")  # 128 experts
    f8, b8 = moehost.layer_ops(qwen, _plan())
    f64, b64 = moehost.layer_ops(qwen, _plan(dp=64, ep=64, global_batch=128))
    assert (f8 - f64, b8 - b64) == (2 * (16 - 2), 6 * (16 - 2))
    full = moehost.layer_ops(qwen, _plan(recompute="full"))
    assert full == (f8, b8 + f8)


def test_host_is_exposed_only_where_the_device_is_faster():
    qwen = load_model("qwen3-30b-a3b")
    fwd, bwd = moehost.layer_ops(qwen, _plan())
    assert moehost.exposed_s(qwen, _plan(), 1.0, 1.0) == 0.0
    assert moehost.exposed_s(qwen, _plan(), 0.0, 0.0) == pytest.approx((fwd + bwd) * moehost.HOST_OP_S)
    assert moehost.exposed_s(qwen, _plan(framework="fsdp", sharding="fsdp-full"), 0.0, 0.0) == 0.0
    assert moehost.exposed_s(load_model("llama3-8b"), _plan(ep=1), 0.0, 0.0) == 0.0


def test_a_b200_micro_batch_of_4k_tokens_is_host_bound_an_h100_one_is_not():
    """Qwen3-30B-A3B, EP 8, one sequence of 4096 tokens, fp8: on B200 the layer's device time is below its
    host time (the published mbs-1 runs are 2-3x slower than mbs 4 per token); on H100 it is not."""
    qwen = load_model("qwen3-30b-a3b")
    plan = _plan(precision="fp8")
    b200 = block_times(qwen, make_cluster(num_gpus=8, gpu="b200"), plan)
    h100 = block_times(qwen, make_cluster(num_gpus=8, gpu="h100-sxm"), plan)
    assert b200.host_s > 0.2 * b200.total_s
    assert h100.host_s == 0.0


def test_padding_to_capacity_skips_the_sync_so_the_host_runs_ahead():
    """``drop_and_pad``: no device-to-host sync, so host time shows only where it passes the device's over the
    whole layer; its preprocess is 3 operations and the router's dropping 8, for the dropless 21."""
    qwen = load_model("qwen3-30b-a3b")
    padded = _plan(moe_capacity_factor=1.0)
    fwd, bwd = moehost.layer_ops(qwen, _plan())
    assert moehost.layer_ops(qwen, padded) == (fwd - 21 + 3 + 8, bwd)
    host_fwd, host_bwd = fwd * moehost.HOST_OP_S, bwd * moehost.HOST_OP_S
    # forward host-bound, backward device-bound: the sync exposes the forward's excess, run-ahead does not
    device_fwd, device_bwd = 0.5 * host_fwd, host_bwd + host_fwd
    assert moehost.exposed_s(qwen, _plan(), device_fwd, device_bwd) == pytest.approx(0.5 * host_fwd)
    assert moehost.exposed_s(qwen, padded, device_fwd, device_bwd) == 0.0


def test_a_host_bound_step_is_not_faster_with_more_expert_work():
    """The GPU idles through the host sync, so DP traffic hides there too: before, more routed work per rank
    (a busier router: ``moe_load_imbalance``) widened the window the gradient reduction hid behind and a
    host-bound Qwen3-30B-A3B step on B300 priced 1.39 s at balance and 1.25 s at 2x."""
    qwen = load_model("qwen3-30b-a3b")
    cluster = make_cluster(num_gpus=16, gpu="b300")
    plan = _plan(dp=16, ep=2, micro_batch=2, sharding="fsdp-full", recompute="selective")
    times = [estimate(qwen, cluster, plan.replace(moe_load_imbalance=x)).step_time_s for x in (1, 1.5, 2, 3)]
    assert all(b >= a * (1 - 1e-12) for a, b in itertools.pairwise(times))
    assert block_times(qwen, cluster, plan).moe_sync_s > 0
