"""Device memory one layer's context-parallel attention holds while it runs, on one rank and micro-batch.

Transient (one layer's attention at a time), so it competes with the MLP backward's temporaries for the
working set of ``activations.backward_working_bytes``. What each implementation keeps at once, beyond the
layer's own Q, K, V and output (``tokens`` = this rank's ``seq_len / cp x micro_batch``, widths split by TP):

- Transformer Engine's p2p ring (``AttnFuncWithCPAndKVP2P.forward``, transformer_engine/pytorch/attention/
  dot_product_attention/context_parallel.py): every step's received K/V stays in ``p2p_comm_buffers`` and
  every step's partial output in ``out_per_step`` until the output correction after the last step: ``cp``
  K/V chunks and ``cp`` partial outputs.
- Transformer Engine's all-gather (``AttnFuncWithCPAndKVAllGather``): the whole sequence's K/V, gathered.
- torch's ring (torchtitan's CP; torch/distributed/tensor/experimental/_attention.py): K and V at the query
  width torchtitan hands SDPA (``cpcomm.sdpa_kv_width``), all ``cp`` chunks with the all-gather rotater, the
  current and next with the all-to-all one; an fp32 output accumulator in forward (``convert_to_f32``); in
  backward the K/V again, fp32 dQ, dK, dV accumulators, and the fp32 dK/dV being sent and received.
- All-to-all (Ulysses; TE ``AttnFuncWithCPAndQKVOA2A``, DeepSpeed): Q, K, V and the output re-laid out
  between sequence and head shards, one more copy of each.
"""

from __future__ import annotations

from autotune.costmodel.cpcomm import sdpa_kv_width
from autotune.modelshape import kv_replicas, qk_v_head_dims
from autotune.plan import CpComm, Framework, ParallelPlan
from autotune.specs import ModelSpec

__all__ = ["cp_attention_bytes"]

ACCUMULATOR_BYTES = 4
"""torch's ring accumulates outputs and gradients in fp32."""


def cp_attention_bytes(model: ModelSpec, plan: ParallelPlan, e: int) -> float:
    """Peak bytes of one layer's CP attention beyond its Q, K, V and output (module docstring); 0 at CP 1."""
    if plan.cp <= 1:
        return 0.0
    tokens = plan.seq_len / plan.cp * plan.micro_batch / plan.tp
    qk, v = qk_v_head_dims(model)  # MLA: the unabsorbed per-head widths the core runs with
    q, out = model.num_heads * qk, model.num_heads * v
    kv = (
        model.num_kv_heads * (qk + v)
        if model.uses_mla
        else 2 * model.kv_hidden_size * kv_replicas(model, plan.tp)
    )
    if plan.cp_comm is CpComm.A2A:
        return tokens * (q + kv + out) * e
    if plan.framework is Framework.FSDP:
        w = 2 * sdpa_kv_width(model) if not model.uses_mla else model.num_heads * (qk + v)  # K and V
        chunks = plan.cp if plan.cp_comm is CpComm.ALLGATHER else 2
        kv_bytes = chunks * tokens * w * e
        forward = kv_bytes + tokens * out * ACCUMULATOR_BYTES
        accumulators = tokens * (q + w) * ACCUMULATOR_BYTES  # dQ, dK, dV
        rotating = 2 * tokens * w * ACCUMULATOR_BYTES  # dK/dV sent and received
        backward = kv_bytes + accumulators + rotating
        return max(forward, backward)
    if plan.cp_comm is CpComm.ALLGATHER:
        return plan.cp * tokens * kv * e
    return plan.cp * tokens * (kv + out) * e
