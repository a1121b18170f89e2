"""Alpha-beta times of NCCL collectives, and where a process group sits in the cluster.

Convention: every function returns seconds on ONE rank of the group, for a payload of ``nbytes`` (the size of
the full tensor: the all-reduced buffer, the gathered output, or the reduce-scatter input), with the bandwidth
a rank actually gets (``GroupLink.bw_bytes_per_s``, already scaled by ``ClusterSpec.collective_efficiency``).

Bandwidth terms follow nccl-tests ``doc/PERFORMANCE.md``: a ring all-reduce moves ``2(n-1)/n`` times the
buffer through every rank's link (its "bus bandwidth" factor), all-gather and reduce-scatter ``(n-1)/n``.
Latency terms are the ring's ``2(n-1)`` / ``(n-1)`` steps, or a tree's ``2 log2(n)`` hops. On NCCL links
(``LinkSpec.ring_hop_s``) a ring's latency is NCCL's own tuning model (src/graph/tuning.cc: ``baseLat`` +
``hwLat`` per hop, Ring/Simple), ``NCCL_RING_BASE_S + (n - N) x intra hop + (N - 1) x network hop`` for a
ring of ``n`` ranks over ``N`` nodes (per reduce-scatter or all-gather pass), spread over the ring's ``n - 1``
steps as ``GroupLink.latency_s``; elsewhere (gloo) each step pays the link's ``latency_s``.

The link is the all-reduce's. Where ``autotune probe`` fitted each collective on its own (a measured profile:
``ClusterSpec.collective_scales``), all-gather and reduce-scatter inside a node use their own latency and
bandwidth, as multiples of the all-reduce's: on NCCL they are close to 1, on gloo they are not (the
probes' figures: benchmarks/results/calibration_summary.md). ``autotune.probe.profile.PER_OP`` says why
send/recv is not among them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from autotune.specs import ClusterSpec

__all__ = [
    "NCCL_RING_BASE_S",
    "GroupLink",
    "group_link",
    "allreduce_busbw_factor",
    "allgather_busbw_factor",
    "ring_allreduce_s",
    "tree_allreduce_s",
    "allreduce_s",
    "allgather_s",
    "reduce_scatter_s",
    "p2p_s",
]


NCCL_RING_BASE_S = 8.4e-6
"""NCCL's base latency of a ring collective, Simple protocol (src/graph/tuning.cc ``baseLat``, Ring/Simple),
paid once per collective (per reduce-scatter or all-gather pass) on top of its per-hop
``LinkSpec.ring_hop_s``."""


class GroupLink(NamedTuple):
    """What one rank of a process group gets from the fabric."""

    bw_bytes_per_s: float
    """Per-rank ring bandwidth a large collective reaches (link peak x collective efficiency)."""
    latency_s: float
    """Per-step latency (alpha) of the slowest hop."""
    num_nodes: int
    """Nodes the group spans (1: it stays inside a node)."""
    scales: tuple[tuple[str, float, float], ...] = ()
    """``(collective, latency multiple, bandwidth multiple)`` of the all-reduce's, measured inside a node."""

    def of(self, op: str) -> GroupLink:
        """This link as ``op`` sees it (itself unless the probe fitted ``op``)."""
        for name, latency, bw in self.scales:
            if name == op:
                return self._replace(
                    bw_bytes_per_s=self.bw_bytes_per_s * bw, latency_s=self.latency_s * latency, scales=()
                )
        return self


def allreduce_busbw_factor(n: int) -> float:
    """Bytes through each rank's link per byte of buffer for a ring all-reduce: ``2(n-1)/n``
    (nccl-tests PERFORMANCE.md, "AllReduce": busBw = algBw * 2(n-1)/n)."""
    return 2.0 * (n - 1) / n


def allgather_busbw_factor(n: int) -> float:
    """``(n-1)/n`` for all-gather and reduce-scatter (nccl-tests PERFORMANCE.md, "AllGather",
    "ReduceScatter"), with the buffer size taken as the full (gathered) tensor."""
    return (n - 1) / n


def group_link(cluster: ClusterSpec, size: int, stride: int) -> GroupLink:
    """Bandwidth and latency of a group of ``size`` ranks whose members are ``stride`` global ranks apart.

    Ranks fill nodes in order, so ``k = min(size, gpus_per_node // stride)`` members share a node (1 when
    ``stride >= gpus_per_node``). If ``size <= k`` the group stays in a node and rings run at the intra-node
    link. Otherwise every node-crossing ring hop goes over the NICs: NCCL builds one ring per channel and
    lays the channels over all NICs of the node (GPUDirect RDMA), so a group gets the node's NICs divided
    by the ``gpus_per_node / k`` groups of the same axis that run the same collective at the same time:
    ``nics * bw * k / gpus_per_node`` per rank. With ``k = 1`` (e.g. DP across nodes under TP=8) this is
    the per-GPU NIC share; with a whole node in one group (pure DP/FSDP) it is the node's full NIC
    bandwidth, which is what nccl-tests reports as multi-node busbw on DGX-class nodes. The ring runs at
    its slowest hop: ``min(intra link, that NIC bandwidth)``.

    "Node" above is the NVLink domain (``ClusterSpec.nvlink_domain``): a GB200 NVL72 rack joins its 18 trays'
    72 GPUs over NVLink Switches, so a group inside a rack rings over NVLink; the NICs are still per node
    (tray), and a domain of ``D`` GPUs has ``D / gpus_per_node`` trays' NICs for its ``D / k`` groups,
    which is the same ``nics * bw * k / gpus_per_node`` per rank.

    Inside a node whose ranks share fewer CPU cores than there are ranks (CPU trials), the ``G =
    gpus_per_node / k`` groups of the axis also share the cores that run their ring steps: each step's latency
    is ``alpha (1 + f (G - 1))`` with ``f = ClusterSpec.shared_core_latency`` (fitted, 0 in the catalog).
    Why: inside real 4-rank TP trials on 2 cores, a TP4 all-reduce and two TP2 pairs reducing at once differ
    by less than their ring steps would say (figures: benchmarks/results/tp_in_trial.json; the fitted ``f``:
    benchmarks/results/calibration_summary.md).
    """
    per_node, domain = cluster.gpus_per_node, cluster.nvlink_domain
    k = 1 if stride >= domain else max(1, min(size, domain // stride))
    eff = cluster.collective_efficiency
    intra = cluster.intra_link
    if size <= k:
        if intra.ring_hop_s is not None:
            return GroupLink(
                intra.bw_bytes_per_s * eff, _nccl_step_s(size, 1, cluster), 1, cluster.collective_scales
            )
        cores = cluster.cores_per_node
        groups = domain // k if cores is not None and cores < per_node else 1
        latency = intra.latency_s * (1.0 + cluster.shared_core_latency * (groups - 1))
        return GroupLink(intra.bw_bytes_per_s * eff, latency, 1, cluster.collective_scales)
    inter = cluster.inter_link
    nic_bw = cluster.nics_per_node * inter.bw_bytes_per_s * k / per_node
    bw = min(intra.bw_bytes_per_s, nic_bw) * eff
    nodes = math.ceil(size / k)
    if intra.ring_hop_s is not None:
        return GroupLink(bw, _nccl_step_s(size, nodes, cluster), nodes)
    return GroupLink(bw, max(intra.latency_s, inter.latency_s), nodes)


def _nccl_step_s(size: int, nodes: int, cluster: ClusterSpec) -> float:
    """NCCL's latency of one pass of a ``size``-rank ring over ``nodes`` nodes (module docstring), per ring
    step: ``(base + (size - nodes) x intra hop + (nodes - 1) x network hop) / (size - 1)``. A network
    without its own hop figure takes its ``latency_s``."""
    intra, inter = cluster.intra_link, cluster.inter_link
    net_hop = inter.ring_hop_s if inter.ring_hop_s is not None else inter.latency_s
    hop_s = (size - nodes) * (intra.ring_hop_s or 0.0) + (nodes - 1) * net_hop
    return (NCCL_RING_BASE_S + hop_s) / max(1, size - 1)


def ring_allreduce_s(nbytes: float, n: int, link: GroupLink) -> float:
    """Ring all-reduce: ``2(n-1)/n * bytes / bw + 2(n-1) * alpha`` (reduce-scatter then all-gather;
    nccl-tests PERFORMANCE.md bus-bandwidth factor)."""
    if n <= 1:
        return 0.0
    return allreduce_busbw_factor(n) * nbytes / link.bw_bytes_per_s + 2 * (n - 1) * link.latency_s


def tree_allreduce_s(nbytes: float, n: int, link: GroupLink) -> float:
    """NCCL double-binary-tree all-reduce (Sanders et al. 2009; NCCL 2.4): each rank sends and receives
    about the buffer twice (reduce up, broadcast down, pipelined), with ``2 log2(n)`` latency hops.
    Only the node level is a tree; its latency term is what wins over a ring at large node counts."""
    if n <= 1:
        return 0.0
    return 2.0 * nbytes / link.bw_bytes_per_s + 2 * math.ceil(math.log2(n)) * link.latency_s


def allreduce_s(nbytes: float, n: int, link: GroupLink, calls: int = 1) -> float:
    """What NCCL's tuner picks: the faster of ring and tree (tree only across nodes). ``calls``: the buffer
    reduced in that many buckets, each paying the latency (as ``allgather_s``)."""
    if n <= 1:
        return 0.0
    each = nbytes / calls
    ring = ring_allreduce_s(each, n, link)
    if link.num_nodes > 1:
        ring = min(ring, tree_allreduce_s(each, n, link))
    return calls * ring


def allgather_s(nbytes: float, n: int, link: GroupLink, calls: int = 1) -> float:
    """Ring all-gather producing ``nbytes`` on every rank: ``(n-1)/n * bytes / bw + (n-1) * alpha``.
    ``calls``: the payload split into that many collectives (one per FSDP unit, DeepSpeed fetch or bucket):
    the same bytes, the ring's latency paid by each."""
    return _ring_s("all_gather", nbytes, n, link, calls)


def reduce_scatter_s(nbytes: float, n: int, link: GroupLink, calls: int = 1) -> float:
    """Ring reduce-scatter of an ``nbytes`` input: the same traffic as an all-gather of the output."""
    return _ring_s("reduce_scatter", nbytes, n, link, calls)


def _ring_s(op: str, nbytes: float, n: int, link: GroupLink, calls: int) -> float:
    if n <= 1:
        return 0.0
    own = link.of(op)
    return allgather_busbw_factor(n) * nbytes / own.bw_bytes_per_s + calls * (n - 1) * own.latency_s


def p2p_s(nbytes: float, link: GroupLink) -> float:
    """One point-to-point send: ``alpha + bytes / bw``."""
    return link.latency_s + nbytes / link.bw_bytes_per_s
