"""Context parallelism: the exposed communication of one block's attention per micro-batch, by the way the
framework exchanges keys and values (``ParallelPlan.cp_comm``).

Convention: the sequence is cut into ``2 x CP`` chunks and each rank holds two, one from each end, so every
rank does the same causal work (Megatron-Core / Transformer Engine load balancing, torchtitan
``context_parallel`` with its round-robin load balancer). The attention kernels themselves are timed by
``compute.attention_s`` at the key length one call sees; this module only adds what the exchange leaves
exposed. On a device without asynchronous collectives (the CPU trial device) nothing overlaps.
"""

from __future__ import annotations

from autotune.costmodel import comm, ncclsm
from autotune.costmodel.tpcomm import act_bytes
from autotune.plan import CpComm, ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["cp_exposed_s"]


def cp_exposed_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float,
                 attn_fwd_s: float, attn_bwd_s: float) -> float:
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
    cp, link = plan.cp, comm.group_link(cluster, plan.cp, plan.tp)
    kv_bytes = 2 * tokens * model.kv_hidden_size / plan.tp * act_bytes(cluster)
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
    exposed = (cp - 1) * (max(0.0, step - overlap * attn_fwd_s / cp)
                          + max(0.0, 2 * step - overlap * attn_bwd_s / cp))
    return exposed + ncclsm.hidden_comm_sm_s(cluster, (cp - 1) * 3 * step - exposed)
