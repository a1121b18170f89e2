"""The GEMMs one transformer block runs per micro-batch on one GPU, as ``(m, n, k, count)`` shapes after
TP, EP and ETP: what ``compute.block_gemm_s`` prices one by one at each shape's efficiency.

Convention: the mean block of the model (an MoE model whose first ``k`` layers are dense runs ``(L - k) / L``
of an MoE MLP and ``k / L`` of a dense one per block: ``count`` carries that share), forward only (a linear
layer's two backward GEMMs have the same intensity). ``m`` is rows (tokens), ``n x k`` the weight.

- Attention: GQA ``Q, K, V`` column-parallel and ``O`` row-parallel over TP (Megatron-Core
  ``attention.py`` ``linear_qkv`` fused; torch models call ``wq``, ``wk``, ``wv`` apart). MLA (DeepSeek-V2
  Sec. 2.1.2; Megatron-Core ``multi_latent_attention.py``): the down projections ``linear_q_down_proj`` /
  ``linear_kv_down_proj`` are duplicated on every TP rank, the up projections column-parallel, ``O``
  row-parallel.
- Gated DeltaNet (``modelshape``): ``in_proj_qkvz`` / ``in_proj_ba`` column-parallel, ``out_proj``
  row-parallel (Megatron-Core splits its heads over TP as attention's), by their share of the layers;
  output-gated softmax attention widens ``Q`` by the gate. Mamba-2 (``modelshape``): ``in_proj``
  column-parallel, ``out_proj`` row-parallel (``ssm/mamba_mixer.py``). A hybrid pattern's layers carry a
  mixer or an MLP each: every kind by its share of the pattern.
- Dense MLP: ``gate/up`` column-parallel (fused in Megatron/TE ``linear_fc1``), ``down`` row-parallel.
- MoE MLP (Megatron-Core ``moe_layer.py``, ``experts.py`` ``GroupedMLP``/``TEGroupedMLP``; torchtitan
  ``moe.py`` grouped experts): the router ``h x E`` on the rank's sequence shard, shared experts split over
  TP as a dense MLP, and ``E / ep`` local experts, each a GEMM over the rows routed to it
  (``moe.tokens_per_expert``), its matrices split over ETP. A grouped GEMM computes whole row tiles per
  expert (``moe.GEMM_TILE_ROWS``: tile quantization), so expert rows are rounded up to a tile.
- DeepSpeed-MoE (``deepspeed/moe/sharded_moe.py`` ``MOELayer.forward`` without Tutel, the default) moves
  tokens to and from the expert slots with two dense GEMMs over a one-hot ``[S, E, C]`` mask, which its
  ``einsum`` rewrites as matmuls (``_deepspeed_dispatch``); they sit before the expert GEMMs, which stay last.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from autotune import modelshape
from autotune.costmodel import moe
from autotune.modelshape import qk_v_head_dims
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ModelSpec

__all__ = ["Gemm", "block_gemms", "routed_expert_gemms"]


class Gemm(NamedTuple):
    m: float
    n: float
    k: float
    count: float = 1.0  # type: ignore[assignment]  # shadows tuple.count, which nothing here calls
    """How many of it the mean block runs (a share of the layers x the local experts)."""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def _attention(model: ModelSpec, tp: int, tokens: float, fused: bool) -> list[Gemm]:
    h, heads = model.hidden_size, model.num_heads
    if model.uses_mla:
        qk, v = qk_v_head_dims(model)
        r_q, r_kv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        q = (
            [Gemm(tokens, r_q, h), Gemm(tokens, heads * qk / tp, r_q)]
            if r_q
            else [Gemm(tokens, heads * qk / tp, h)]
        )
        kv_up = heads * (model.qk_nope_head_dim + v) / tp
        return q + [Gemm(tokens, r_kv + rope, h), Gemm(tokens, kv_up, r_kv), Gemm(tokens, h, heads * v / tp)]
    q_width, kv = heads * model.head_dim, model.kv_hidden_size
    q_proj = 2 * q_width if model.attention_output_gate else q_width  # queries and the output gate
    front = (
        [Gemm(tokens, (q_proj + 2 * kv) / tp, h)]
        if fused
        else [Gemm(tokens, q_proj / tp, h), Gemm(tokens, kv / tp, h), Gemm(tokens, kv / tp, h)]
    )
    return front + [Gemm(tokens, h, q_width / tp)]


def _linear_attention(model: ModelSpec, tp: int, tokens: float, fused: bool, share: float) -> list[Gemm]:
    """A Gated DeltaNet layer's projections (``modelshape`` docstring), heads split over TP: ``in_proj_qkvz``
    and ``in_proj_ba`` (one GEMM where the framework fuses its input projections), ``out_proj``."""
    k, v = modelshape.linear_widths(model)
    h, ba = model.hidden_size, 2 * model.linear_value_heads
    front = (
        [Gemm(tokens, (2 * k + 2 * v + ba) / tp, h, share)]
        if fused
        else [Gemm(tokens, (2 * k + 2 * v) / tp, h, share), Gemm(tokens, ba / tp, h, share)]
    )
    return front + [Gemm(tokens, h, v / tp, share)]


def _mamba(model: ModelSpec, tp: int, tokens: float, share: float) -> list[Gemm]:
    """A Mamba-2 layer's ``in_proj`` (z, x, B, C, dt in one column-parallel GEMM, heads and groups split over
    TP) and row-parallel ``out_proj`` (``modelshape`` docstring)."""
    d_in, gn = modelshape.mamba_widths(model)
    h = model.hidden_size
    return [
        Gemm(tokens, (2 * d_in + 2 * gn + model.mamba_heads) / tp, h, share),
        Gemm(tokens, h, d_in / tp, share),
    ]


def _mixers(model: ModelSpec, tp: int, tokens: float, fused: bool) -> list[Gemm]:
    """The token mixers' GEMMs of the mean block: softmax attention, Gated DeltaNet and Mamba-2 by their
    shares."""
    softmax = _attention(model, tp, tokens, fused)
    if not model.num_linear_layers and not model.layer_pattern:
        return softmax
    linear = (
        _linear_attention(model, tp, tokens, fused, model.linear_share) if model.num_linear_layers else []
    )
    mamba = _mamba(model, tp, tokens, model.mamba_share) if model.mamba_heads else []
    return [g._replace(count=model.softmax_share) for g in softmax if model.softmax_share] + linear + mamba


def _mlp(h: int, f: float, up: int, tp: int, tokens: float, fused: bool, share: float) -> list[Gemm]:
    if f <= 0 or share <= 0:
        return []
    front = (
        [Gemm(tokens, up * f / tp, h, share)] if fused or up == 1 else [Gemm(tokens, f / tp, h, share)] * up
    )
    return front + [Gemm(tokens, h, f / tp, share)]


def _deepspeed_dispatch(model: ModelSpec, plan: ParallelPlan, tokens: float, share: float) -> list[Gemm]:
    """DeepSpeed-MoE's dispatch ``einsum("sec,sm->ecm")`` = ``[E C, S] x [S, M]`` and combine
    ``einsum("sec,ecm->sm")`` = ``[S, E C] x [E C, M]`` over this rank's ``S`` tokens (``sharded_moe.py``
    ``einsum``), ``E C`` the experts' padded slots: ``top-k x S`` times the capacity factor (``topkgating``:
    ``capacity = ceil(k S / E x capacity_factor)``), or, dropless (``drop_tokens=False``), times the busiest
    expert's load (the capacity becomes the all-reduced maximum of ``exp_counts``): ``moe.busiest_load``.
    Quadratic in the micro-batch's tokens; the backward is priced as for any linear (2x), one GEMM more than
    it runs (the mask takes no gradient)."""
    slots = moe.busiest_load(plan) * model.experts_per_token * tokens
    h = model.hidden_size
    return [Gemm(slots, h, tokens, share), Gemm(tokens, h, slots, share)]


def block_gemms(model: ModelSpec, plan: ParallelPlan, tokens: float, *, fused: bool) -> list[Gemm]:
    """The forward GEMMs of the mean block on one rank for ``tokens`` tokens of a micro-batch (module
    docstring); their FLOPs sum to ``flops.layer_gemm_flops_per_token x tokens / tp`` up to the duplicated
    MLA down projections and the expert tile rounding."""
    h, tp, up = model.hidden_size, plan.tp, model.num_mlp_matrices - 1
    gemms = _mixers(model, tp, tokens, fused)
    num_moe = len(model.moe_layers) if model.is_moe else 0
    moe_share = num_moe / model.num_layers
    dense_share = model.num_dense_mlp_layers / model.num_layers if model.layer_pattern else 1.0 - moe_share
    gemms += _mlp(h, model.ffn_hidden_size, up, tp, tokens, fused, dense_share)
    if not num_moe:
        return gemms
    gemms.append(Gemm(tokens / tp, model.num_experts, h, moe_share))  # router, on the sequence shard
    if model.moe_latent_size:  # LatentMoE's projections, duplicated over TP, on the sequence shard
        latent = model.moe_latent_size
        gemms += [Gemm(tokens / tp, latent, h, moe_share), Gemm(tokens / tp, h, latent, moe_share)]
    gemms += _mlp(h, model.shared_ffn_hidden_size, up, tp, tokens, fused, moe_share)
    if plan.framework is Framework.DEEPSPEED:
        gemms += _deepspeed_dispatch(model, plan, tokens, moe_share)
    return gemms + routed_expert_gemms(model, plan, tokens)


def routed_expert_gemms(model: ModelSpec, plan: ParallelPlan, tokens: float) -> list[Gemm]:
    """The routed experts' two grouped GEMMs of the mean block (the last entries of ``block_gemms``): what
    Megatron's MoE layer runs between the dispatch and the combine; [] for a dense model."""
    if not model.is_moe:
        return []
    up = model.num_mlp_matrices - 1
    rows = moe.tokens_per_expert(model, plan, tokens) * moe.busiest_load(plan)
    rows = math.ceil(rows / moe.GEMM_TILE_ROWS) * moe.GEMM_TILE_ROWS if rows > 0 else 0.0
    local = model.num_experts / plan.ep * len(model.moe_layers) / model.num_layers
    f_e = model.expert_ffn_hidden_size / plan.etp
    w = model.expert_width  # LatentMoE: the latent
    return [Gemm(rows, up * f_e, w, local), Gemm(rows, w, f_e, local)]
