"""Work of a dense decoder per token and layer: FLOPs of GEMMs and attention, and the HBM bytes of the
memory-bound (elementwise) kernels between them.

Conventions:
- A multiply-add is 2 FLOPs. Backward = 2 x forward (input and weight gradients; Narayanan et al. 2021
  Sec. 5.1).
- GEMM FLOPs are ``2 x tokens x weights`` of each linear layer, counted exactly for GQA (K and V are
  ``h x kv``) and gated MLPs (three ``h x ffn`` matrices), plus the LM head ``2 h V``.
- Attention scores and the weighted sum (``QK^T`` and ``PV``) are ``4 s h`` per token per layer when every key
  is visited (Narayanan Eq. 3's ``s/(6h)`` term). FlashAttention with a causal mask skips the tiles above the
  diagonal (Dao 2023, FlashAttention-2 Sec. 3.1.1), so a causal layer EXECUTES about half of that:
  ``CAUSAL_ATTENTION_FRACTION``. Published MFU conventions (PaLM App. B, Megatron Eq. 3, torchtitan) count the
  full ``4 s h``; ``model_flops_per_token`` follows them so MFUs compare, while the time model passes the
  executed fraction (``causal_fraction``).
- Cross-checks (tests): for GPT-shaped models (MHA, ``ffn = 4h``, 2 matrices) the layer GEMMs reduce to
  ``24 h^2`` per token, so full recompute gives Narayanan Eq. 3 ``96 B s l h^2 (1 + s/6h + V/16lh)`` and no
  recompute Korthikanti Eq. 7 ``72 B s l h^2 (1 + s/6h + V/12lh)``. Selective recompute adds one
  attention-core forward, ``4 B s^2 h l``; Korthikanti's HFU (Eq. 8, ``s/3h``) counts the attention term
  twice, i.e. more.
- Elementwise bytes (``elementwise_bytes_per_token``) follow the tensors Korthikanti et al. 2022 Sec. 4.1
  count for activation memory, as HBM traffic: each kernel reads its inputs and writes its output once (fused
  kernels, as in Megatron and torch.compile).
"""

from __future__ import annotations

from autotune import modelshape
from autotune.specs import ModelSpec

__all__ = [
    "CAUSAL_ATTENTION_FRACTION",
    "layer_gemm_flops_per_token",
    "attention_flops_per_token",
    "lm_head_flops_per_token",
    "model_flops_per_token",
    "recompute_flops_per_token",
    "elementwise_bytes_per_token",
    "score_bytes_per_token",
    "LOGITS_BYTES_PER_VOCAB",
    "layer_gemm_shapes",
    "linear_attention_flops_per_token",
    "linear_attention_bytes_per_token",
]

CAUSAL_ATTENTION_FRACTION = 0.5
"""Share of ``QK^T``/``PV`` tiles a causal FlashAttention kernel computes (those on or below the diagonal;
the diagonal tiles add ``block/s``, under 5% of the halved work at s >= 2048 with 128-wide tiles)."""


def layer_gemm_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs of one block per token: ``2 x`` its weight-matrix entries
    (Q, O: ``h x h``; K, V: ``h x kv``; MLP: ``num_mlp_matrices x h x ffn``). Biases and norms are not
    GEMMs. MLA, MoE (router, top-k routed and shared experts) and explicit head widths: the weights a token
    passes through, the mean over blocks (``modelshape.gemm_params_per_layer``)."""
    return 2.0 * modelshape.gemm_params_per_layer(model)


def layer_gemm_shapes(model: ModelSpec, tp: int = 1, *, fused: bool = True) -> list[tuple[int, int]]:
    """The ``(n, k)`` weight shapes of one block's forward GEMMs on one TP rank (each multiplies the tokens'
    ``m x k`` activations); their ``2 n k`` sum to ``layer_gemm_flops_per_token / tp``. ``fused``: Megatron /
    Transformer Engine run Q, K, V as one column-parallel GEMM and the gate and up projections as one
    (``megatron/core/transformer/attention.py`` ``linear_qkv``, ``mlp.py`` ``linear_fc1``); torch models
    (torchtitan's Llama, Hugging Face) call ``wq``, ``wk``, ``wv``, ``w1``, ``w3`` separately."""
    h, kv, f = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size
    up = model.num_mlp_matrices - 1
    if fused:
        front = [((h + 2 * kv) // tp, h), (up * f // tp, h)]
    else:
        front = [(h // tp, h), (kv // tp, h), (kv // tp, h)] + [(f // tp, h)] * up
    return front + [(h, h // tp), (h, f // tp)]


def attention_flops_per_token(model: ModelSpec, seq_len: int, *, causal_fraction: float = 1.0) -> float:
    """Forward ``QK^T`` and ``PV`` FLOPs of one layer per query token: ``2 x 2 x s x h`` (Narayanan Eq. 3
    counts ``4 B s^2 h`` per layer), times the fraction of key tiles a causal kernel visits. Generally
    ``2 s H (d_qk + d_v)`` (explicit head widths, MLA's 192-wide ``QK^T``), the mean over layers of the keys
    each visits (sliding-window and chunked layers: ``modelshape.attention_span_fraction``)."""
    qk, v = modelshape.qk_v_head_dims(model)
    span = modelshape.attention_span_fraction(model, seq_len, causal_fraction)
    return 2.0 * seq_len * model.num_heads * (qk + v) * span * model.softmax_share


def linear_attention_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the chunked gated delta rule per token, the mean over blocks (0 without Gated
    DeltaNet layers), plus Mamba-2's SSD scan (``_ssd_flops_per_token``), the other chunked linear
    recurrence. Per chunk of ``C`` tokens and value head (Yang et al. 2024, "Parallelizing Linear
    Transformers with the Delta Rule over Sequence Length", Sec. 3.3, with the gates of Gated DeltaNet, Yang
    et al. ICLR 2025 Sec. 3): ``K K^T``, ``Q K^T`` and ``W = T K`` (``2 C^2 d_k`` each), ``U = T V`` and the
    intra-chunk product with ``U - W S`` (``2 C^2 d_v`` each), the triangular solve for ``T``
    (``2 C^3 / 3``), and ``W S``, ``Q S`` and the state update ``K^T (U - W S)`` (``2 C d_k d_v`` each);
    queries and keys are repeated to the value heads (``repeat_interleave``), so per token
    ``n_v (6 C d_k + 4 C d_v + 2 C^2 / 3 + 6 d_k d_v)``, ``C = modelshape.GDN_CHUNK``."""
    mamba = _ssd_flops_per_token(model)
    if not model.num_linear_layers:
        return mamba
    c, dk, dv = modelshape.GDN_CHUNK, model.linear_key_head_dim, model.linear_value_head_dim
    per_head = 6 * c * dk + 4 * c * dv + 2 * c * c / 3 + 6 * dk * dv
    return model.linear_value_heads * per_head * model.linear_share + mamba


def _ssd_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of Mamba-2's chunked SSD scan per token, the mean over layers (0 without Mamba-2
    layers). Per chunk of ``Q`` tokens (Dao & Gu 2024 Sec. 6, the four steps of its SSD algorithm): the
    intra-chunk ``C B^T`` per group (``2 Q N`` per token) and its masked product with ``x`` per head
    (``2 Q P``), the chunk states ``B^T x`` and the output from the states ``C h`` (``2 N P`` each) per head:
    ``2 Q N G + H (2 Q P + 4 N P)``, ``Q = modelshape.MAMBA_CHUNK``. The state passing between chunks and the
    gating are ``O(H N P / Q)``, left out."""
    if not model.mamba_heads:
        return 0.0
    q, n, p = modelshape.MAMBA_CHUNK, model.mamba_state_dim, model.mamba_head_dim
    per_token = 2 * q * n * model.mamba_groups + model.mamba_heads * (2 * q * p + 4 * n * p)
    return per_token * model.mamba_share


def linear_attention_bytes_per_token(model: ModelSpec) -> float:
    """Forward HBM bytes per token of the chunked gated delta rule's kernels (and of Mamba-2's SSD scan,
    ``_ssd_bytes_per_token``), the mean over blocks: per value
    head they read ``q, k, v`` and write ``o`` (16-bit), write and read back ``w`` and ``u`` (``d_k + d_v``,
    FLA ``recompute_w_u_fwd``) and the 16-bit chunk states ``h`` (``d_k d_v`` per chunk, written by
    ``chunk_gated_delta_rule_fwd_h``, read by ``chunk_fwd_o``)."""
    mamba = _ssd_bytes_per_token(model)
    if not model.num_linear_layers:
        return mamba
    c, dk, dv = modelshape.GDN_CHUNK, model.linear_key_head_dim, model.linear_value_head_dim
    per_head = 2.0 * (2 * dk + 2 * dv) + 4.0 * (dk + dv) + 4.0 * dk * dv / c
    return model.linear_value_heads * per_head * model.linear_share + mamba


def _ssd_bytes_per_token(model: ModelSpec) -> float:
    """Forward HBM bytes per token of the SSD scan's kernels (mamba_ssm ``_mamba_chunk_scan_combined_fwd``:
    chunk cumsum, chunk state, state passing, ``C B^T``, chunk scan), the mean over layers: 16-bit ``x``,
    ``B``, ``C`` and ``dt`` read twice (chunk state and chunk scan) and ``y`` written, the fp32 chunk states
    (``H P N`` per chunk) written and read back twice (state passing, chunk scan), and the fp32 ``C B^T``
    (``Q`` per token and group) written and read."""
    if not model.mamba_heads:
        return 0.0
    d_in, gn = modelshape.mamba_widths(model)
    q, heads, groups = modelshape.MAMBA_CHUNK, model.mamba_heads, model.mamba_groups
    inputs = 2.0 * 2 * (d_in + 2 * gn + heads) + 2.0 * d_in
    states = 4.0 * 3 * heads * model.mamba_head_dim * model.mamba_state_dim / q
    return (inputs + states + 4.0 * 2 * q * groups) * model.mamba_share


def lm_head_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the output projection ``h x V`` per token (Narayanan Eq. 3's ``V/(16 l h)`` term)."""
    return 2.0 * model.hidden_size * model.vocab_size


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Forward + backward model FLOPs per trained token, no recompute: ``3 x (L x (GEMMs + full attention)
    + LM head)``. This is the MFU numerator of PaLM (App. B) and Megatron (Korthikanti Eq. 7). Each
    multi-token prediction module adds a block (the mean block), its ``eh_proj`` (``2 x 2h x h``) and a head
    pass, as Megatron counts them (``megatron/training/training.py`` ``num_floating_point_operations``:
    ``mtp_num_layers`` more layers, "MTP eh proj", logits x ``(mtp_num_layers + 1)``); a hybrid's MTP block
    is its ``mtp_pattern`` layers (``modelshape.mtp_block_model``)."""
    hybrid = modelshape.mtp_block_model(model)
    block = (
        _layer_flops(model, seq_len) if hybrid is None else hybrid.num_layers * _layer_flops(hybrid, seq_len)
    )
    mtp = model.mtp_layers * (block + 4.0 * model.hidden_size**2 + lm_head_flops_per_token(model))
    return 3.0 * (model.num_layers * _layer_flops(model, seq_len) + lm_head_flops_per_token(model) + mtp)


def _layer_flops(model: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of the mean block: GEMMs, full attention, linear-attention / SSD scans."""
    return (
        layer_gemm_flops_per_token(model)
        + attention_flops_per_token(model, seq_len)
        + linear_attention_flops_per_token(model)
    )


def recompute_flops_per_token(
    model: ModelSpec, seq_len: int, recompute: str, *, causal_fraction: float = 1.0
) -> float:
    """Extra forward FLOPs per token of activation recomputation (Korthikanti et al. 2022 Sec. 4-5):
    ``full`` repeats every block's forward (not the LM head); ``selective`` only the attention core
    (``QK^T``, softmax, ``PV``); ``none`` nothing."""
    if recompute == "full":
        per_layer = (
            layer_gemm_flops_per_token(model)
            + attention_flops_per_token(model, seq_len, causal_fraction=causal_fraction)
            + linear_attention_flops_per_token(model)
        )
    elif recompute == "selective":
        per_layer = attention_flops_per_token(model, seq_len, causal_fraction=causal_fraction)
    else:
        return 0.0
    return model.num_layers * per_layer


NORM_RESIDUAL_PASSES = 11
"""16-bit ``h``-wide tensors read or written per token by one block's forward outside GEMMs: two norms (read +
write: 4) and two fused bias-dropout-residual adds (read 2, write 1, 1-byte mask: 3.5 each). A Llama block
(no dropout; RoPE on q/k instead) moves about as much."""
SCORE_BYTES = 13
"""Bytes per attention-score element per head when the ``s x s`` scores are materialised (pre-FlashAttention
kernels): write ``QK^T`` (2), fused scale-mask-softmax read + write (4), dropout read + write + mask (5),
read by the ``PV`` GEMM (2). Korthikanti Sec. 4.1 stores 5 of these bytes as activations."""
LOGITS_BYTES_PER_VOCAB = 12
"""Bytes per token and vocabulary entry of the LM head's loss (Megatron's fp32 vocab-parallel cross-entropy):
write 16-bit logits (2), read them and write fp32 softmax (6), read it for the gradient and write it (4)."""


def elementwise_bytes_per_token(model: ModelSpec, *, tp: int = 1, sequence_parallel: bool = False) -> float:
    """Forward HBM bytes per token of one block's memory-bound kernels on one TP rank, attention scores
    excluded (``score_bytes_per_token``): norms and residual adds on ``h`` (split over TP only with sequence
    parallelism: Korthikanti Sec. 4.2.2), and the MLP activation on the ``ffn/tp`` slice (GELU: read + write;
    SwiGLU: read two, write one), and Gated DeltaNet's or Mamba-2's convolution and gated norm. A hybrid
    pattern's layer has one norm and one residual add (``ModelSpec.sublayers_per_layer``).
    """
    h_passes = NORM_RESIDUAL_PASSES * model.sublayers_per_layer / 2 / (tp if sequence_parallel else 1)
    act_passes = 3 if model.gated_mlp else 2
    ffn = modelshape.active_ffn_per_layer(model)
    # MoE: permute and unpermute read and write the top-k token copies (Megatron moe_utils.py permute)
    permute = 4 * modelshape.routed_width_per_layer(model) / tp
    linear = _linear_elementwise_width(model) / tp
    return 2.0 * (h_passes * model.hidden_size + act_passes * ffn / tp + permute + linear)


def _linear_elementwise_width(model: ModelSpec) -> float:
    """Gated DeltaNet's memory-bound kernels per token, the mean over blocks: the causal convolution with
    its SiLU reads and writes ``2K + V`` (``causal_conv1d_fn``), the gated RMSNorm reads ``o`` and ``z`` and
    writes ``V`` (the L2 norms of ``q`` and ``k`` run inside the delta-rule kernel)."""
    mamba = _mamba_elementwise_width(model)
    if not model.num_linear_layers:
        return mamba
    k, v = modelshape.linear_widths(model)
    return (2 * (2 * k + v) + 3 * v) * model.linear_share + mamba


def _mamba_elementwise_width(model: ModelSpec) -> float:
    """Mamba-2's memory-bound kernels per token outside the scan, the mean over layers: the causal
    convolution with its SiLU reads and writes ``d_in + 2 G N`` (run again in backward by the
    memory-efficient path, priced with the backward's 2x), the gated RMSNorm reads ``y`` and ``z`` and writes
    ``d_in``."""
    if not model.mamba_heads:
        return 0.0
    d_in, gn = modelshape.mamba_widths(model)
    return (2 * (d_in + 2 * gn) + 3 * d_in) * model.mamba_share


def score_bytes_per_token(model: ModelSpec, seq_len: int, *, tp: int = 1) -> float:
    """Forward HBM bytes per query token of materialised attention scores: ``SCORE_BYTES x heads/tp x s``
    (Korthikanti Sec. 4.1's ``5 a s^2 b`` activation term, as traffic). Zero for FlashAttention, which keeps
    the scores in on-chip memory (Dao et al. 2022 Sec. 3)."""
    return SCORE_BYTES * model.num_heads / tp * seq_len
