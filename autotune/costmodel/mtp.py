"""Multi-token prediction: what its modules add to the last pipeline stage per micro-batch.

DeepSeek-V3's MTP (report Sec. 2.2; Megatron-Core ``multi_token_prediction.py``, placed after the decoder
on the last pipeline stage, ``--mtp-num-layers``) runs, per module and micro-batch, ``enorm`` / ``hnorm`` on
the previous hidden state and the shifted token embedding, ``eh_proj`` (``[s, 2h] x [2h, h]``, column-parallel
over TP), one block of the last layer's type, and the shared output head with its own loss. Priced as one
more (mean) block, the head pass again, and the ``eh_proj`` GEMM forward + backward (3x); the norms and the
embedding lookup are memory-bound and small against the block (not priced). A hybrid model's MTP block is its
``mtp_pattern`` (Nemotron 3: ``*E``, an attention and an MoE layer; megatron-core 0.17
``multi_token_prediction.py`` builds it as a ``MambaStack`` of that pattern), priced as those layers
(``modelshape.mtp_block_model``) rather than the main model's mean layer, which is mostly Mamba-2. Memory: the
last stage holds the modules' states (one module when ``mtp_shared``: ``mtp_use_repeated_layer`` runs one
module at every depth), one more block's activations and one more set of logits per depth
(``costmodel.stagestates``, ``costmodel.memory``). Not priced: the modules' gradients in the last stage's DP
reduction (one block's worth beside the stage's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.costmodel import kernels
from autotune.costmodel.blocktime import block_times
from autotune.modelshape import mtp_block_model
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

if TYPE_CHECKING:
    from autotune.costmodel.blocktime import BlockTimes

__all__ = ["modules_s"]


def modules_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, bt: BlockTimes) -> float:
    """Seconds the MTP modules add to one micro-batch on the last pipeline rank (module docstring)."""
    if not model.mtp_layers:
        return 0.0
    h, tokens = model.hidden_size, plan.micro_batch * plan.seq_len / plan.cp
    eh_proj = 3 * kernels.gemm_s(cluster.gpu, str(plan.precision), tokens, h / plan.tp, 2 * h)
    hybrid = mtp_block_model(model)
    block_s = bt.total_s if hybrid is None else hybrid.num_layers * block_times(hybrid, cluster, plan).total_s
    return model.mtp_layers * (block_s + bt.head_s + bt.head_tp_s + eh_proj)
