"""Alpha-beta collectives and topology placement (autotune.costmodel.comm)."""

import dataclasses
import math

import pytest

from autotune.catalog import load_link, load_model, make_cluster
from autotune.costmodel import comm
from autotune.costmodel.tpcomm import reduction_s
from autotune.plan import ParallelPlan

_GB = 1e9


def _link(bw_gb_s: float, latency_s: float = 0.0, nodes: int = 1) -> comm.GroupLink:
    return comm.GroupLink(bw_gb_s * _GB, latency_s, nodes)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64])
def test_ring_allreduce_busbw_matches_nccl_tests(n):
    """nccl-tests PERFORMANCE.md: algbw = S / t and busbw = algbw * 2(n-1)/n, which for an ideal ring equals
    the per-rank link bandwidth; all-gather / reduce-scatter use (n-1)/n."""
    size, link = 4 * _GB, _link(100)
    algbw = size / comm.ring_allreduce_s(size, n, link)
    assert algbw * 2 * (n - 1) / n == pytest.approx(100 * _GB)
    assert comm.allreduce_busbw_factor(n) == pytest.approx(2 * (n - 1) / n)
    algbw_ag = size / comm.allgather_s(size, n, link)
    assert algbw_ag * (n - 1) / n == pytest.approx(100 * _GB)
    assert comm.reduce_scatter_s(size, n, link) == comm.allgather_s(size, n, link)


def test_latency_terms_and_tree_for_small_messages_across_many_nodes():
    link = _link(25, latency_s=5e-6, nodes=128)
    assert comm.ring_allreduce_s(0.0, 1024, link) == pytest.approx(2 * 1023 * 5e-6)
    assert comm.tree_allreduce_s(0.0, 1024, link) == pytest.approx(2 * 10 * 5e-6)
    assert comm.allreduce_s(1e3, 1024, link) == comm.tree_allreduce_s(1e3, 1024, link)
    two_nodes = _link(25, latency_s=5e-6, nodes=2)  # few ranks, big buffer: the ring's 2(n-1)/n < 2 wins
    assert comm.allreduce_s(10 * _GB, 16, two_nodes) == comm.ring_allreduce_s(10 * _GB, 16, two_nodes)
    assert comm.ring_allreduce_s(1e9, 1, link) == 0.0 and comm.allgather_s(1e9, 1, link) == 0.0
    assert comm.p2p_s(25 * _GB, link) == pytest.approx(1.0 + 5e-6)


def test_placement_inside_a_node_and_across_nodes():
    """Rank order pp, dp, cp, tp on 8-GPU H100 nodes with 8 x 400 Gb/s NICs."""
    cluster = make_cluster(num_gpus=32, gpu="h100-sxm")
    eff = cluster.collective_efficiency
    tp8 = comm.group_link(cluster, 8, 1)
    assert tp8.num_nodes == 1 and tp8.bw_bytes_per_s == pytest.approx(450 * _GB * eff)  # NVLink 4
    dp_under_tp8 = comm.group_link(cluster, 4, 8)  # one member per node, 8 such rings share the NICs
    assert dp_under_tp8.num_nodes == 4 and dp_under_tp8.bw_bytes_per_s == pytest.approx(50 * _GB * eff)
    pure_dp = comm.group_link(cluster, 32, 1)  # whole nodes in one ring: all 8 NICs, capped by NVLink
    assert pure_dp.num_nodes == 4 and pure_dp.bw_bytes_per_s == pytest.approx(400 * _GB * eff)
    dp_under_tp4 = comm.group_link(cluster, 8, 4)  # 2 members per node, 4 concurrent rings
    assert dp_under_tp4.bw_bytes_per_s == pytest.approx(100 * _GB * eff)


def test_node_nic_aggregate_matches_nccl_issue_1048():
    """NVIDIA/nccl#1048: 2 nodes of 8 A100 with 4 x 200 Gb/s NICs; all-reduce busbw theoretical 100 GB/s
    (measured 86), with one NIC 24 GB/s."""
    four = make_cluster(num_gpus=16, gpu="a100-80gb", nics_per_node=4)
    one = make_cluster(num_gpus=16, gpu="a100-80gb", nics_per_node=1)
    eff = four.collective_efficiency
    assert comm.group_link(four, 16, 1).bw_bytes_per_s / eff == pytest.approx(100 * _GB)
    assert comm.group_link(one, 16, 1).bw_bytes_per_s / eff == pytest.approx(25 * _GB)


def test_gradient_allreduce_of_30b_model_over_1gbe_takes_minutes_over_infiniband_seconds():
    """30B parameters of bf16 gradients (60 GB), data parallel over 2 nodes x 8 GPUs."""
    grads = 30e9 * 2
    slow = make_cluster(num_gpus=16, gpu="a100-80gb", inter_node="1gbe", nics_per_node=1)
    fast = make_cluster(num_gpus=16, gpu="a100-80gb", inter_node="ib-200", nics_per_node=8)
    t_slow = comm.allreduce_s(grads, 16, comm.group_link(slow, 16, 1))
    t_fast = comm.allreduce_s(grads, 16, comm.group_link(fast, 16, 1))
    # 2 x 15/16 x 60 GB over 0.125 GB/s x 0.85: ~18 minutes; over 8 x 25 GB/s (x 0.85): ~0.7 s
    assert 10 * 60 < t_slow < 30 * 60
    assert 0.3 < t_fast < 2.0
    assert math.isclose(t_slow / t_fast, 200 / 0.125, rel_tol=0.01)


def test_measured_collectives_use_their_own_fit_inside_a_node():
    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")
    scales = (("all_gather", 0.5, 2.0), ("reduce_scatter", 3.0, 0.5))
    scaled = dataclasses.replace(cluster, collective_scales=scales)
    plain, own = comm.group_link(cluster, 8, 1), comm.group_link(scaled, 8, 1)
    nbytes = 64 * 2**20
    assert comm.allreduce_s(nbytes, 8, own) == comm.allreduce_s(nbytes, 8, plain)  # the all-reduce's link
    gather = comm.allgather_busbw_factor(8) * nbytes / (2 * plain.bw_bytes_per_s) + 7 * 0.5 * plain.latency_s
    assert comm.allgather_s(nbytes, 8, own) == pytest.approx(gather)
    factor = comm.allgather_busbw_factor(8)
    reduce = factor * nbytes / (0.5 * plain.bw_bytes_per_s) + 7 * 3.0 * plain.latency_s
    assert comm.reduce_scatter_s(nbytes, 8, own) == pytest.approx(reduce)
    assert comm.p2p_s(nbytes, own) == comm.p2p_s(nbytes, plain)
    # across nodes the NICs set the numbers: the in-node fits do not apply
    multi = dataclasses.replace(scaled, num_nodes=2)
    assert comm.group_link(multi, 16, 1).scales == ()


def test_sequence_parallel_pays_its_gather_and_scatter_at_their_own_rates():
    model = load_model("tiny")
    cluster = make_cluster(num_gpus=2, gpu="cpu")
    plan = ParallelPlan(tp=2, global_batch=4, micro_batch=2, seq_len=64, sequence_parallel=True)
    link = comm.group_link(cluster, 2, 1)
    nbytes = 2 * 64 * model.hidden_size * 4
    assert reduction_s(nbytes, plan, link) == pytest.approx(comm.allreduce_s(nbytes, 2, link))  # same ring
    slow_scatter = dataclasses.replace(cluster, collective_scales=(("reduce_scatter", 4.0, 0.25),))
    link = comm.group_link(slow_scatter, 2, 1)
    assert reduction_s(nbytes, plan, link) > comm.allreduce_s(nbytes, 2, link)
    no_sp = plan.replace(sequence_parallel=False)
    assert reduction_s(nbytes, no_sp, link) == comm.allreduce_s(nbytes, 2, link)


def test_groups_that_share_cpu_cores_queue_their_ring_steps_by_the_fitted_share():
    """4 CPU ranks on 2 cores: the two TP pairs of TP2 x DP2 reduce at the same time on the same cores."""
    cpu = dataclasses.replace(make_cluster(num_gpus=4, gpu="cpu", gpus_per_node=4), cores_per_node=2)
    alpha = cpu.intra_link.latency_s
    assert comm.group_link(cpu, 2, 1).latency_s == alpha  # the catalog: independent rings
    queued = dataclasses.replace(cpu, shared_core_latency=0.5)
    assert comm.group_link(queued, 2, 1).latency_s == pytest.approx(1.5 * alpha)  # 2 pairs of the TP axis
    assert comm.group_link(queued, 2, 2).latency_s == pytest.approx(1.5 * alpha)  # 2 pairs of the DP axis
    assert comm.group_link(queued, 4, 1).latency_s == alpha  # one world group: nothing to queue behind
    full = dataclasses.replace(cpu, shared_core_latency=1.0)
    pair = comm.group_link(full, 2, 1)
    assert comm.allreduce_s(0, 2, pair) == pytest.approx(4 * alpha)  # 2 groups x 2 steps
    assert comm.allreduce_s(0, 4, comm.group_link(full, 4, 1)) == pytest.approx(6 * alpha)
    # a core per rank (or a device per rank): the share does not apply
    for cores in (4, None):
        assert comm.group_link(dataclasses.replace(queued, cores_per_node=cores), 2, 1).latency_s == alpha
    gpus = dataclasses.replace(make_cluster(num_gpus=8, gpu="h100-sxm"), shared_core_latency=1.0)
    assert comm.group_link(gpus, 2, 1) == comm.group_link(make_cluster(num_gpus=8, gpu="h100-sxm"), 2, 1)


def test_an_nvl72_rack_is_one_nvlink_domain_for_every_collective():
    """GB200 NVL72 (hardware.yaml ``nvlink_domain_gpus: 72``): a group inside the rack rings over NVLink 5
    although it spans trays of 4; a job's ranks fill racks evenly (256 GPUs: 64 a rack); NICs stay
    per tray."""
    rack = make_cluster(num_gpus=256, gpu="gb200")
    assert (rack.gpus_per_node, rack.nvlink_domain) == (4, 64)
    assert make_cluster(num_gpus=144, gpu="gb200").nvlink_domain == 72
    inside = comm.group_link(rack, 64, 1)
    assert inside.num_nodes == 1 and inside.bw_bytes_per_s == pytest.approx(900 * _GB * 0.85)
    across = comm.group_link(rack, 4, 64)  # one rank a rack: the tray's NIC share per GPU
    assert across.num_nodes == 4 and across.bw_bytes_per_s == pytest.approx(50 * _GB * 0.85)
    trays = dataclasses.replace(rack, nvlink_domain_gpus=None)  # the node as the domain, as before
    assert comm.group_link(trays, 64, 1).num_nodes == 16
    h100 = make_cluster(num_gpus=64, gpu="h100-sxm")
    assert h100.nvlink_domain == 8 and comm.group_link(h100, 16, 1).num_nodes == 2


def test_nvlink_domain_must_hold_whole_nodes():
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="nvlink_domain_gpus"):
        make_cluster(num_gpus=16, gpu="h100-sxm", nvlink_domain_gpus=12)
    assert make_cluster(num_gpus=32, gpu="h100-sxm", nvlink_domain_gpus=16).nvlink_domain == 16


def test_nccl_rings_pay_nccl_s_own_latency_model():
    """On NCCL links a ring pass costs NCCL's tuning model (src/graph/tuning.cc, Ring/Simple): 8.4 us once,
    3.4 us per NVLink hop and 14 us per network hop, spread over the ring's ``n - 1`` steps; a small 8-GPU
    all-gather is ~32 us, not 7 x the link's 8 us whole-collective latency."""
    us = 1e-6
    node = make_cluster(num_gpus=8, gpu="h100-sxm")
    inside = comm.group_link(node, 8, 1)
    assert inside.latency_s * 7 == pytest.approx((8.4 + 7 * 3.4) * us)
    assert comm.allgather_s(0.0, 8, inside) == pytest.approx((8.4 + 7 * 3.4) * us)
    many = make_cluster(num_gpus=64, gpu="h100-sxm")  # 8 nodes of 8
    across = comm.group_link(many, 64, 1)
    assert across.num_nodes == 8
    assert across.latency_s * 63 == pytest.approx((8.4 + 56 * 3.4 + 7 * 14.0) * us)
    strided = comm.group_link(many, 8, 8)  # one rank per node: every hop crosses the network
    assert strided.latency_s * 7 == pytest.approx((8.4 + 7 * 14.0) * us)


def test_gloo_links_keep_their_per_step_latency():
    """The CPU trial device's links (gloo over shared memory / loopback TCP) have no NCCL hop figure: each
    ring step pays the link's ``latency_s`` as measured by ``autotune probe``."""
    for name in ("shm", "loopback-tcp"):
        assert load_link(name).ring_hop_s is None
    for name in ("nvlink4", "nvlink5", "ib-ndr-400", "roce-400", "pcie5"):
        assert load_link(name).ring_hop_s is not None
