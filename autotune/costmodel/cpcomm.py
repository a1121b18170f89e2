"""Context parallelism: the exposed communication of one block's attention per micro-batch, by the way the
framework exchanges keys and values (``ParallelPlan.cp_comm``).

Convention: the sequence is cut into ``2 x CP`` chunks and each rank holds two, one from each end, so every
rank does the same causal work (Megatron-Core / Transformer Engine load balancing, torchtitan
``context_parallel`` with its round-robin load balancer). The attention kernels themselves are timed by
``compute.attention_s`` at the key length one call sees; this module only adds what the exchange leaves
exposed. On a device without asynchronous collectives (the CPU trial device) nothing overlaps.
"""

from __future__ import annotations

from autotune.costmodel import comm, compute, ncclsm
from autotune.costmodel.tpcomm import act_bytes
from autotune.modelshape import kv_replicas
from autotune.plan import CpComm, Framework, ParallelPlan, Recompute
from autotune.specs import ClusterSpec, ModelSpec

__all__ = [
    "cp_exposed_s",
    "torch_ring_s",
    "torch_ring_hbm_s",
    "sdpa_kv_width",
    "MERGE_BYTES",
    "GRAD_ACC_BYTES",
]

MERGE_BYTES = 38.0
"""HBM bytes per attention-output element of one ring step's merge in torch's ``_SDPAMerger._merge_one``
(torch/distributed/tensor/experimental/_attention.py, torch 2.6 era), fp32 since ``convert_to_f32`` is on:
cast the block output to fp32 (2 + 4), ``out - block_out`` (4 + 4 + 4), times the sigmoid of the LSE gap
(4 + 4), subtracted from ``out`` (4 + 4 + 4); each an eager elementwise kernel. The slowest rank of the
round-robin layout (the last) merges the whole output every step."""
GRAD_ACC_BYTES = (10.0, 25.0)
"""HBM bytes per (query-gradient, key/value-gradient) element of one backward ring step in torch's
``_templated_ring_attention_backward``: fp32 ``grad_query += grad_query_`` (4 + 2 + 4); for K/V the
fp32 accumulation into half the buffer and ``_partial_update``'s ``torch.cat`` of the whole (5 + 8), the
``torch.cat`` that flattens dK/dV for the rotation (8) and the one that flattens K/V (4)."""


def sdpa_kv_width(model: ModelSpec) -> int:
    """Width of the K (and V) tensors torchtitan's models hand to SDPA: the query heads', since they expand
    grouped K/V heads first (``repeat_kv(xk, self.n_rep)`` before ``F.scaled_dot_product_attention`` in
    torchtitan/models/llama/model.py, the Llama 3 model of its Dec 2024 CP benchmark). Under CP the ring
    therefore exchanges, and accumulates gradients of, ``num_heads / num_kv_heads`` times the K/V bytes of
    the grouped tensors (4x for Llama 3 8B, 16x for 405B)."""
    return model.num_heads * model.head_dim


def cp_exposed_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    tokens: float,
    attn_fwd_s: float,
    attn_bwd_s: float,
) -> float:
    """Exposed seconds of the CP exchange of one block and micro-batch, forward + backward, for ``tokens``
    local tokens whose attention takes ``attn_fwd_s`` / ``attn_bwd_s``:

    - ``p2p`` ring (Liu et al. 2023; TE ``AttnFuncWithCPAndKVP2P``; torchtitan ``alltoall`` rotation): each of
      ``cp-1`` steps passes this rank's K and V (``2 x tokens x kv/tp``) on while the attention of the chunk
      already held runs, one ``1/cp`` of the attention per step; backward passes K, V and their gradients
      (2x the bytes) under the backward steps. Only what a step's transfer exceeds its compute is exposed.
    - ``allgather`` (TE ``AttnFuncWithCPAndKVAllGather``; torchtitan's default ``allgather`` rotation): all
      K and V gathered at once, behind the local chunk's attention only; the gradients reduce-scattered
      likewise.
    - ``a2a`` (DeepSpeed-Ulysses, Jacobs et al. 2023; TE ``AttnFuncWithCPAndQKVOA2A``): Q, K, V all-to-all'd
      from sequence to head shards before the attention and the output back, four exchanges each way, none
      overlapped.
    """
    if plan.cp <= 1:
        return 0.0
    if plan.framework is Framework.FSDP and plan.cp_comm is not CpComm.A2A:
        return torch_ring_s(model, cluster, plan, tokens, attn_fwd_s, attn_bwd_s)
    cp, link = plan.cp, comm.group_link(cluster, plan.cp, plan.tp)
    kv_bytes = 2 * tokens * model.kv_hidden_size * kv_replicas(model, plan.tp) / plan.tp * act_bytes(cluster)
    overlap = 1.0 if cluster.gpu.async_collectives else 0.0
    if plan.cp_comm is CpComm.A2A:
        width = 2 * model.hidden_size + 2 * model.kv_hidden_size  # q and out, k and v
        one_way = comm.allgather_s(cp * tokens * width / plan.tp * act_bytes(cluster) / cp, cp, link, calls=4)
        return 2 * one_way
    if plan.cp_comm is CpComm.ALLGATHER:
        gather = comm.allgather_s(cp * kv_bytes, cp, link)
        scatter = comm.reduce_scatter_s(cp * kv_bytes, cp, link)
        exposed = max(0.0, gather - overlap * attn_fwd_s / cp) + max(0.0, scatter - overlap * attn_bwd_s / cp)
        return exposed + ncclsm.hidden_comm_sm_s(cluster, gather + scatter - exposed)
    step = comm.p2p_s(kv_bytes, link)
    exposed = (cp - 1) * (
        max(0.0, step - overlap * attn_fwd_s / cp) + max(0.0, 2 * step - overlap * attn_bwd_s / cp)
    )
    return exposed + ncclsm.hidden_comm_sm_s(cluster, (cp - 1) * 3 * step - exposed)


def torch_ring_hbm_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float
) -> tuple[float, float]:
    """(forward, backward) seconds of the memory-bound kernels torch's ring runs around its attention calls
    for one block and micro-batch: the ``cp - 1`` merges of a step's output into the fp32 accumulator
    (``MERGE_BYTES`` per output element) and, backward, the fp32 dQ/dK/dV accumulation of each of the ``cp``
    steps (``GRAD_ACC_BYTES``), at ``compute.hbm_rate``. Together with ``compute.attention_s`` this is the
    ring's compute, measured on one H200 (benchmarks/results/gpu_kernels_h200.json "ring")."""
    kv_elems = 2 * tokens * sdpa_kv_width(model) / plan.tp
    out_elems = tokens * model.hidden_size / plan.tp
    rate = compute.hbm_rate(cluster)
    merge = out_elems * MERGE_BYTES * (plan.cp - 1) / rate
    acc = plan.cp * (out_elems * GRAD_ACC_BYTES[0] + kv_elems * GRAD_ACC_BYTES[1]) / rate
    return merge, acc


def torch_ring_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    tokens: float,
    attn_fwd_s: float,
    attn_bwd_s: float,
) -> float:
    """Seconds torch's experimental context parallel (torchtitan's CP; torch/distributed/tensor/
    experimental/_attention.py) adds to one block and micro-batch beyond the attention kernels:

    - forward (``_templated_ring_attention``): K/V exchanged by the ``_RingRotater`` of ``plan.cp_comm``
      (``_AllGatherRotater`` once, ``_AllToAllRotater`` per step, waited at the next step, so overlapped as
      in ``cp_exposed_s``), and ``cp - 1`` merges of the step's output into the fp32 accumulator
      (``MERGE_BYTES``), re-run when full recompute re-runs the forward;
    - backward (``_templated_ring_attention_backward``): K/V rotated again, and dK/dV rotated by an
      all-to-all ``dkv_rotater`` in fp32 (twice the bf16 K/V bytes) after every step, waited at the next
      one; the last transfer has no step to hide behind; fp32 gradient accumulation (``GRAD_ACC_BYTES``).
    Merges and accumulation are memory-bound kernels (``torch_ring_hbm_s``). K and V reach SDPA, and so the
    ring, at the query width (``sdpa_kv_width``)."""
    cp, link = plan.cp, comm.group_link(cluster, plan.cp, plan.tp)
    kv_elems = 2 * tokens * sdpa_kv_width(model) / plan.tp
    kv_bytes = kv_elems * act_bytes(cluster)
    overlap = 1.0 if cluster.gpu.async_collectives else 0.0
    if plan.cp_comm is CpComm.ALLGATHER:
        kv_fwd = comm.allgather_s(cp * kv_bytes, cp, link)
        kv_exposed = max(0.0, kv_fwd - overlap * attn_fwd_s / cp)
        kv_bwd_exposed = max(0.0, kv_fwd - overlap * attn_bwd_s / cp)
    else:
        kv_fwd = (cp - 1) * comm.p2p_s(kv_bytes, link)
        kv_exposed = (cp - 1) * max(0.0, kv_fwd / (cp - 1) - overlap * attn_fwd_s / cp)
        kv_bwd_exposed = (cp - 1) * max(0.0, kv_fwd / (cp - 1) - overlap * attn_bwd_s / cp)
    dkv_step = comm.p2p_s(kv_elems * 4.0, link)
    dkv_exposed = (cp - 1) * max(0.0, dkv_step - overlap * attn_bwd_s / cp) + dkv_step
    merge_s, acc_s = torch_ring_hbm_s(model, cluster, plan, tokens)
    reruns = 2 if plan.recompute is Recompute.FULL else 1
    hbm_s = merge_s * reruns + acc_s
    comm_total = 2 * kv_fwd + cp * dkv_step
    exposed = kv_exposed + kv_bwd_exposed + dkv_exposed
    return hbm_s + exposed + ncclsm.hidden_comm_sm_s(cluster, max(0.0, comm_total - exposed))
