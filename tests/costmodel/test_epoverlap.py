"""Megatron's EP all-to-all overlap (autotune.costmodel.epoverlap, ``plan.moe_a2a_overlap``)."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import epoverlap
from autotune.costmodel.estimate import estimate
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan


def _plan(**kw):
    return ParallelPlan(
        **{
            "dp": 16,
            "ep": 16,
            "global_batch": 256,
            "seq_len": 4096,
            "framework": "megatron",
            "sharding": "zero1",
            **kw,
        }
    )


def test_a_layer_pair_follows_the_two_streams_of_schedule_layer_1f1b():
    """Hand-walked: comm combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd, comp pre | dgrad ->
    wgrad -> mlp | pre_bwd, each node after what it consumes."""
    w = epoverlap.LayerWork(pre_fwd_s=2, mlp_fwd_s=3, pre_bwd_s=4, mlp_dgrad_s=3, mlp_wgrad_s=3, a2a_s=1)
    # start 2; dispatch fwd ends 3, dgrad 5; dispatch bwd 6; wgrad 8 -> mlp fwd 11; combine fwd 12; pre bwd 15
    assert epoverlap.layer_pair_s(w) == 15
    assert epoverlap.layer_pair_s(w._replace(a2a_s=0)) == w.compute_s
    slow = w._replace(a2a_s=10)  # communication-bound: the comm stream's 40 s plus what it waits for
    assert epoverlap.layer_pair_s(slow) >= 4 * slow.a2a_s
    assert epoverlap.layer_pair_s(slow) <= slow.compute_s + 4 * slow.a2a_s


def test_only_the_steady_state_overlaps():
    assert epoverlap.overlapped_share(_plan(global_batch=128)) == pytest.approx(7 / 8)  # m = 8
    interleaved = _plan(pp=4, dp=4, ep=4, schedule="interleaved", virtual_stages=2, global_batch=32)
    # m = 8, v = 2: warm-up 2 x 3 + 1 x 4 + 1 = 11 of 16 chunk forwards
    assert epoverlap.overlapped_share(interleaved) == pytest.approx(5 / 16)


def test_the_overlap_hides_exchange_and_holds_what_the_plain_schedule_holds():
    qwen, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16, gpu="h100-sxm")  # EP 16 on 2 nodes
    plain, overlapped = _plan(), _plan(moe_a2a_overlap=True)
    a, b = estimate(qwen, cluster, plain), estimate(qwen, cluster, overlapped)
    assert 0 < b.time.ep_comm_s < a.time.ep_comm_s
    assert b.step_time_s < a.step_time_s
    assert a.step_time_s - b.step_time_s < a.time.ep_comm_s  # never more than the exchange
    assert b.memory.activations_bytes == a.memory.activations_bytes  # lockstep: one layer saved, one freed


def test_megatrons_rules_for_the_overlap_are_plan_errors():
    """transformer_config.py's asserts, each a one-line error naming the fix."""
    _plan(moe_a2a_overlap=True, pp=2, dp=8, ep=8, schedule="interleaved", virtual_stages=2)
    for kw, fix in (
        (dict(framework="fsdp", sharding="fsdp-full"), "--framework megatron"),
        (dict(ep=1), "--ep > 1"),
        (dict(moe_dispatcher="allgather"), "--moe-dispatcher alltoall"),
        (dict(pp=2, dp=8, ep=8), "--schedule interleaved"),
        (dict(recompute="full"), "--recompute selective or none"),
        (dict(recompute="selective", recompute_modules=("moe",)), "moe in --recompute-modules"),
    ):
        with pytest.raises(ConfigError, match="moe-a2a-overlap") as e:
            _plan(moe_a2a_overlap=True, **kw)
        assert fix in str(e.value) and "\n" not in str(e.value)
