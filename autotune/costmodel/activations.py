"""Activation memory on one GPU (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", arXiv:2205.05198, Sec. 4, Eq. 1-2 and Table 2).

Convention: bytes on ONE rank, per transformer layer and per micro-batch unless a name says otherwise;
``s`` is the sequence each rank sees (``seq_len / cp``: context parallelism splits the sequence), ``b``
the micro-batch, ``t`` the TP degree, ``e`` the activation element size (2 for bf16). ``memory.py`` takes
the worst of the first and the last pipeline stage.

The paper's GPT layer stores ``sbh(34 + 5as/h)`` bytes: LayerNorm inputs 4sbh, QKV and MLP inputs 4sbh,
dropout masks 2sbh (those 10 are not split by TP without sequence parallelism), Q and K 4sbh, V 2sbh, the
output-projection input 2sbh, GeLU input and output 16sbh (the 24 split by TP), and the attention core
5as^2b (softmax 2, its dropout mask 1, dropout output 2). Generalised here, term by term:

- GQA: K and V are ``kv_hidden`` wide, so Q+K+V store ``e sb(h + 2 kv)``.
- Gated MLP (SwiGLU): eager PyTorch stores gate, silu(gate), up and their product (4 ffn-wide tensors);
  Megatron's fused ``bias_swiglu`` stores the gate/up input and the product (3); a GeLU MLP stores 2.
- FlashAttention (Dao et al. 2022, Alg. 2) stores no ``s^2`` scores, only the output (the projection's
  input, already counted) and an fp32 log-sum-exp per head and token: ``4 a s b``. ``FLASH_ATTENTION``
  is the default for bf16 training (torch SDPA, Megatron/TE, DeepSpeed all dispatch to it).
- Norms: fused RMSNorm/LayerNorm kernels (Apex, TE, torch.compile) store the input and per-token fp32
  statistics; eager PyTorch's decomposed RMSNorm also stores ``x * rstd`` (seen in the CPU cross-check).
- No dropout by default (``DROPOUT``): Llama 1-3, Mistral, OLMo pretrain without it.

What each framework's recompute and fp8 keep (``kernels_for``): Megatron's selective recompute drops the
attention core only (``--recompute-granularity selective``, megatron/core/transformer/attention.py
``_checkpointed_attention_forward``), which under flash attention is the log-sum-exp; torchtitan's
selective recompute (what framework ``fsdp`` emits, ``selective_ac_option = "op"``) is per-op SAC
(``op_sac_bytes``); Transformer Engine under fp8 saves the inputs of its GEMMs in fp8
(``fp8_gemm_inputs``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune import modelshape
from autotune.costmodel import moe
from autotune.plan import Framework, LossKernel, ParallelPlan, Precision, Recompute
from autotune.specs import ModelSpec

__all__ = [
    "FLASH_ATTENTION",
    "DROPOUT",
    "Kernels",
    "kernels_for",
    "LayerShape",
    "norm_side_bytes",
    "tp_split_bytes",
    "attention_core_bytes",
    "op_sac_bytes",
    "layer_activation_bytes",
    "stage_activation_bytes",
    "offloaded_layers",
    "host_activation_bytes",
    "backward_working_bytes",
    "head_activation_bytes",
]

FLASH_ATTENTION = True
"""Attention stores no ``s x s`` matrices (FlashAttention / memory-efficient SDPA). False reproduces the
paper's ``5as/h`` term."""
DROPOUT = False
"""Dropout layers with 1-byte masks (GPT-3/Megatron defaults); modern LLM pretraining uses none."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Kernels:
    """Which implementation choices shape what autograd stores."""

    flash_attention: bool = FLASH_ATTENTION
    fused_norm: bool = True
    """Norm stores its input + fp32 statistics only (False: eager decomposed RMSNorm, +1 sbh per norm)."""
    fused_swiglu: bool = False
    """Megatron's fused SwiGLU: 3 ffn-wide tensors instead of eager PyTorch's 4."""
    fused_cross_entropy: bool = False
    """Megatron's vocab-parallel cross-entropy computes its fp32 softmax and gradient in place."""
    te_cross_entropy: bool = False
    """Transformer Engine's ``parallel_cross_entropy`` (Megatron ``--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te``, ``plan.loss_kernel`` fused; transformer_engine/pytorch/cross_entropy.py
    ``CrossEntropyFunction``, TE v2.5-v2.17): its forward writes the gradient into the bf16 logits and saves
    them, its backward scales them in place (``lossbytes.TE_LOSS_BYTES_PER_VOCAB``)."""
    dropout: bool = DROPOUT
    mask_bytes: int = 1
    """Dropout masks are stored as 1-byte tensors (Korthikanti Sec. 4.1)."""
    op_sac: bool = False
    """Selective recompute is torchtitan's per-op SAC (``op_sac_bytes``), not Megatron's attention-core
    recompute."""
    compiled_sac: bool = False
    """The op-SAC block runs under ``torch.compile`` (torchtitan compiles each block with its checkpoint):
    AOTAutograd's partitioner saves what the backward reads, so a MUST_SAVE output nothing reads is not kept
    (the down projection's; ``op_sac_bytes``). Measured on CPU with Inductor, torch 2.13:
    benchmarks/results/compiled_sac_saved.json (eager keeps 7 tensors, compiled 6, without ``w2``'s)."""
    loss_parallel: bool = False
    """torch's vocab-parallel loss (``torch.distributed.tensor.parallel.loss_parallel``, what torchtitan
    runs with TP): its backward holds four fp32 logit-sized buffers (``loss_transient_bytes``)."""
    fp8_gemm_inputs: bool = False
    """Transformer Engine fp8: the inputs its GEMMs save for backward are fp8 (1 B) copies
    (transformer_engine/pytorch/module/layernorm_linear.py and linear.py save the quantized ``ln_out`` /
    ``inputmat`` when ``fp8``), so the QKV, projection, FC1 and FC2 inputs take 1 B; the attention core
    keeps its bf16 Q, K, V and output (the projection's fp8 input is a second copy of that output)."""
    routed_saved_h: int = 2
    """``h``-wide tensors an MoE block keeps per routed token copy (``moe.routed_saved_h_tensors``)."""
    dense_dispatch: bool = False
    """DeepSpeed-MoE: dispatch and combine are dense ``[S, E, C]`` einsums (``gemms._deepspeed_dispatch``)
    whose operands autograd keeps (``dense_dispatch_bytes``)."""
    gathered_head_input: bool = False
    """torch TP (torchtitan's and the trials' plan): the output layer is ``ColwiseParallel(input_layouts=
    Shard(1))``, so under sequence parallelism its input is all-gathered first and ``F.linear`` saves the
    gathered ``s b h`` tensor (``head_activation_bytes``)."""
    compiled_loss: bool = False
    """torchtitan compiles its cross-entropy with the model (torchtitan/components/loss.py
    ``build_cross_entropy_loss``: ``torch.compile(loss_fn)`` when compile is on, since torchtitan bbb1b616e,
    2025-04-02; ``compile.components`` defaults to model and loss in 0.2.2). Inductor's graph keeps only the
    compute-dtype logits for backward and writes their gradient in one fused kernel
    (``loss_stored_bytes``, ``loss_transient_bytes``). So does flash-attn's ``CrossEntropyLoss``
    (``plan.loss_kernel`` fused): ``save_for_backward(logits, lse, labels)``, then ``empty_like(logits)``."""
    chunked_loss: bool = False
    """Liger's ``LigerFusedLinearCrossEntropyLoss`` (``plan.loss_kernel`` chunked): the head GEMM and the loss
    by token chunks, both gradients made in forward (``costmodel.lossmemory``)."""
    loss_bytes: int = 4
    """Element size of the eager cross-entropy's softmax and gradients: 4 with the logits upcast first (every
    framework's default), 2 for a bf16 loss (``plan.loss_kernel``)."""


def kernels_for(plan: ParallelPlan) -> Kernels:
    """The kernels each framework runs: Megatron fuses SwiGLU and the cross-entropy and, under fp8, saves
    fp8 GEMM inputs (Transformer Engine); PyTorch (FSDP2 trials, torchtitan) and DeepSpeed run the model's
    eager MLP and ``F.cross_entropy``. Framework fsdp's selective recompute is torchtitan's op SAC. Its fp8
    (torchao float8 linears) is priced at bf16 activation bytes: torchtitan's own tables measure the same
    peak with and without Float8 under op SAC + compile (docs/performance.md, Llama 3.1 8B: 76.8 vs 77.0 GiB
    on 8 H100s, 61.8 vs 62.0 GiB on 128)."""
    megatron = plan.framework is Framework.MEGATRON
    torchtitan_compiled = plan.framework is Framework.FSDP and plan.compile and plan.tp == 1
    return Kernels(
        fused_swiglu=megatron,
        fused_cross_entropy=megatron,
        te_cross_entropy=megatron and plan.loss_kernel is LossKernel.FUSED,
        compiled_loss=torchtitan_compiled or (plan.loss_kernel is LossKernel.FUSED and not megatron),
        chunked_loss=plan.loss_kernel is LossKernel.CHUNKED,
        loss_bytes=2 if plan.loss_kernel is LossKernel.BF16 else 4,
        gathered_head_input=plan.framework is Framework.FSDP,
        op_sac=plan.framework is Framework.FSDP,
        compiled_sac=plan.framework is Framework.FSDP and plan.compile,
        loss_parallel=plan.framework is Framework.FSDP and plan.tp > 1,
        fp8_gemm_inputs=megatron and plan.precision is Precision.FP8,
        routed_saved_h=moe.routed_saved_h_tensors(plan),
        dense_dispatch=plan.framework is Framework.DEEPSPEED,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerShape:
    """One rank's view of a layer's tensors (before TP splitting)."""

    s: float
    b: int
    h: int
    kv: int
    ffn: float
    heads: int
    vocab: int
    gated: bool
    attn_width: float = 0.0
    """Q, K, V and the output projection's input per token (0: ``2h + 2kv``); MLA's latents too
    (``modelshape.attention_activation_width``)."""
    routed: float = 0.0
    """MoE: ``h``-wide top-k token copies per token, the mean over blocks (0 for dense models)."""
    routed_peak: float = 0.0
    """MoE: the dispatch buffers of one MoE block per token (``moe.dispatch_buffer_width``; 0 for dense
    models)."""
    sublayers: int = 2
    """Norms and residual adds of a layer (``ModelSpec.sublayers_per_layer``: 1 in a hybrid pattern)."""
    attention_share: float = 1.0
    """Share of a hybrid pattern's layers that run softmax attention, keeping its log-sum-exp (else 1)."""

    @classmethod
    def of(cls, model: ModelSpec, plan: ParallelPlan) -> LayerShape:
        """``ffn`` is the MLP width a token passes through (MoE: top-k experts + shared, the mean over
        blocks: ``modelshape.active_ffn_per_layer``). The last shape made is kept: one estimate asks for
        it of every stage it checks."""
        global _LAST_SHAPE
        last_model, last_plan, last = _LAST_SHAPE
        if last is not None and last_model is model and last_plan is plan:
            return last
        shape = cls._of(model, plan)
        _LAST_SHAPE = (model, plan, shape)  # one tuple, replaced whole: safe across threads
        return shape

    @classmethod
    def _of(cls, model: ModelSpec, plan: ParallelPlan) -> LayerShape:
        return cls(
            s=plan.seq_len / plan.cp,
            b=plan.micro_batch,
            h=model.hidden_size,
            kv=model.kv_hidden_size * modelshape.kv_replicas(model, plan.tp),
            ffn=modelshape.active_ffn_per_layer(model)
            + modelshape.routed_ffn_per_layer(model) * (moe.busiest_load(plan) - 1.0),
            heads=model.num_heads,
            vocab=model.vocab_size,
            gated=model.gated_mlp,
            attn_width=modelshape.attention_activation_width(model, plan.tp),
            routed=modelshape.routed_width_per_layer(model) * moe.busiest_load(plan),
            routed_peak=moe.dispatch_buffer_width(model, plan),
            sublayers=model.sublayers_per_layer,
            attention_share=model.softmax_share if model.layer_pattern else 1.0,
        )


_LAST_SHAPE: tuple[object, object, LayerShape | None] = (None, None, None)
"""(model, plan, its shape): ``LayerShape.of``'s last answer."""


def norm_side_bytes(x: LayerShape, e: int, k: Kernels) -> float:
    """Tensors of the residual side, not split by TP (split by ``t`` with sequence parallelism): two norm
    inputs, two norm outputs (the QKV and MLP inputs), ``x*rstd`` of unfused norms, two dropout masks (one
    of each in a hybrid pattern's layer).
    Korthikanti Sec. 4.1 / Eq. 2: 10sbh (4 + 4 + 2) for LayerNorm with dropout, e = 2."""
    n = x.sublayers  # a hybrid pattern's layer has one norm and one residual add
    tensors = n * (2 + (0 if k.fused_norm else 1))
    masks = n * k.mask_bytes if k.dropout else 0
    fp8_saving = n * (e - 1) if k.fp8_gemm_inputs else 0  # the norm outputs are GEMM inputs
    return x.s * x.b * x.h * (tensors * e + masks - fp8_saving)


def tp_split_bytes(x: LayerShape, e: int, k: Kernels) -> float:
    """Tensors split by TP (before dividing by ``t``): Q, K, V (K and V ``kv`` wide), the
    output-projection input, and the MLP intermediates (gated: 4 eager / 3 fused ffn-wide; GeLU: 2).
    Korthikanti Eq. 2: 24sbh for kv = h, ffn = 4h, e = 2 (Q,K 4 + V 2 + projection input 2 + GeLU 16).
    MoE blocks also keep one ``h``-wide tensor per routed token copy, the permuted expert input that the
    first expert GEMM saves for its weight gradient (fp8 plans: its fp8 copy); Megatron applies the router
    probability inside the expert activation, not to an ``h``-wide tensor (``moe.routed_saved_h_tensors``)."""
    sb = x.s * x.b
    attention = sb * (x.attn_width or 2 * x.h + 2 * x.kv) * e
    mlp_tensors = (3 if k.fused_swiglu else 4) if x.gated else 2
    routed = sb * k.routed_saved_h * x.routed * (1 if k.fp8_gemm_inputs else e)  # MoE: docstring
    if k.fp8_gemm_inputs:  # + the projection's fp8 input; the FC2 input (last MLP tensor) in fp8
        return attention + sb * x.h + sb * x.ffn * ((mlp_tensors - 1) * e + 1) + routed
    return attention + sb * x.ffn * mlp_tensors * e + routed


def attention_core_bytes(x: LayerShape, e: int, k: Kernels) -> float:
    """What the attention core stores beyond Q, K, V and its output (before dividing by ``t``).
    Eager: softmax ``e as^2b``, with dropout also its mask and output (Korthikanti: 5as^2b).
    FlashAttention: the fp32 log-sum-exp, ``4 a s b`` (Dao et al. 2022, Alg. 2)."""
    if k.flash_attention:
        return 4.0 * x.heads * x.s * x.b * x.attention_share
    per_score = e + ((k.mask_bytes + e) if k.dropout else 0)
    return per_score * x.heads * x.s * x.s * x.b * x.attention_share


def layer_activation_bytes(
    x: LayerShape, *, tp: int, sp: bool, recompute: Recompute, e: int, k: Kernels
) -> float:
    """Stored bytes of one layer for one micro-batch (Korthikanti Table 2): ``sbh(34 + 5as/h)`` without
    parallelism; ``sbh(10 + 24/t + 5as/(ht))`` with TP; everything ``/t`` with TP + SP; selective
    recompute drops the attention core; full recompute keeps only the layer input ``2sbh`` (``/t``
    with SP)."""
    side_div = tp if sp else 1
    if recompute is Recompute.FULL:
        return x.s * x.b * x.h * e / side_div
    if recompute is Recompute.SELECTIVE and k.op_sac:
        return op_sac_bytes(x, tp=tp, sp=sp, e=e, k=k)
    stored = (
        norm_side_bytes(x, e, k) / side_div + tp_split_bytes(x, e, k) / tp + dense_dispatch_bytes(x, e, k)
    )
    if recompute is Recompute.NONE:
        stored += attention_core_bytes(x, e, k) / tp
    return stored


def dense_dispatch_bytes(x: LayerShape, e: int, k: Kernels) -> float:
    """What DeepSpeed-MoE's dense dispatch keeps for backward (mean block): its gate builds the combine
    weights as a dense fp32 ``[S, E, C]`` tensor and the dispatch mask from it (``sharded_moe.py``
    ``top1gating`` / ``top2gating`` / ``topkgating``: ``combine_weights = einsum("se,sc->sec", ...)``,
    ``dispatch_mask = combine_weights.bool()``), and the combine / dispatch einsums keep them (fp32) and the
    mask cast to the activation dtype: ``S x E C x (4 + e)`` bytes, ``E C`` the padded slots (routed
    copies per token x ``S``). Quadratic in the micro-batch's tokens; 0 for other frameworks."""
    if not k.dense_dispatch or not x.routed:
        return 0.0
    tokens = x.s * x.b
    return tokens * tokens * (x.routed / x.h) * (4 + e)


def op_sac_bytes(x: LayerShape, *, tp: int, sp: bool, e: int, k: Kernels) -> float:
    """One layer under torchtitan's per-op selective AC (torchtitan/distributed/activation_checkpoint.py
    ``_apply_op_sac``, save list ``_op_sac_save_list`` in torchtitan/models/llama3/infra/parallelize.py):
    outputs of ``aten.mm`` are saved except every second one of the block, SDPA's outputs and TP's
    reduce-scatters are saved, everything else is recomputed. A Llama block calls its matmuls in the order
    q, k, v, o, gate, up, down (GeLU MLP: up, down), so q, v, gate and down are kept (GeLU: q, v, up);
    column-parallel outputs are ``1/t`` wide, row-parallel ones (o, down) the full ``h`` of partial sums.
    Plus the block input the checkpoint keeps (``/t`` with SP), SDPA's output and fp32 log-sum-exp, and with
    SP the two reduce-scattered outputs (``h/t`` each). Compiled (``Kernels.compiled_sac``), the down
    projection's output, and with SP its reduce-scattered copy, are not kept: no backward reads them (the
    residual add's backward needs neither; the MLP's is computed from its input)."""
    side_div = tp if sp else 1
    mlp = [x.ffn / tp, x.ffn / tp, x.h] if x.gated else [x.ffn / tp, x.h]
    widths = [x.h / tp, x.kv / tp, x.kv / tp, x.h] + mlp
    saved = widths[0::2]  # the 1st, 3rd, 5th, ... matmul of the block
    down_saved = len(widths) % 2 == 1  # the block's last matmul falls on a saved slot
    if k.compiled_sac and down_saved:
        saved = saved[:-1]
    kept = sum(saved)
    scattered = (1 if k.compiled_sac else 2) * x.h / tp if sp else 0.0
    elements = x.h / side_div + kept + x.h / tp + scattered
    return x.s * x.b * elements * e + attention_core_bytes(x, e, k) / tp


def stage_activation_bytes(x: LayerShape, plan: ParallelPlan, *, layers: float, e: int, k: Kernels) -> float:
    """Stored bytes of ``layers`` blocks for one micro-batch. With ``recompute_layers`` (Megatron
    ``--recompute-method block``: megatron/core/transformer/transformer_block.py ``_checkpointed_forward``
    checkpoints the first ``recompute_num_layers`` layers of each chunk) only those store their input; the
    others store everything."""
    tp, sp, rc = plan.tp, plan.sequence_parallel, plan.recompute
    full = layer_activation_bytes(x, tp=tp, sp=sp, recompute=rc, e=e, k=k)
    layers = layers - offloaded_layers(plan, layers)
    if plan.recompute_layers is None or rc is not Recompute.FULL:
        return layers * full
    recomputed = min(float(layers), float(plan.recompute_layers * plan.virtual_stages))
    kept = layer_activation_bytes(x, tp=tp, sp=sp, recompute=Recompute.NONE, e=e, k=k)
    return recomputed * full + (layers - recomputed) * kept


def offloaded_layers(plan: ParallelPlan, layers: float) -> float:
    """Blocks whose stored activations are in host memory at the peak (``plan.offload_activation_layers``).
    Megatron hands ``cpu_offloading_num_layers`` to Transformer Engine's ``get_cpu_offload_context``
    (megatron/core/transformer/transformer_block.py; transformer_engine/pytorch/cpu_offload.py
    ``AsyncDoubleBufferGroupOffloadHandler``): the first N layers' saved tensors are copied to pinned host
    memory while the next layer computes, and in backward each is reloaded one layer ahead. At the start of
    backward the device holds the kept layers plus the offloaded layer being reloaded: N - 1 are away."""
    n = min(float(plan.offload_activation_layers), float(layers))
    return max(0.0, n - 1.0)


def host_activation_bytes(x: LayerShape, plan: ParallelPlan, *, layers: float, e: int, k: Kernels) -> float:
    """Pinned host memory the offloaded layers' activations take for one GPU (``offloaded_layers``)."""
    n = min(float(plan.offload_activation_layers), float(layers))
    return n * layer_activation_bytes(
        x, tp=plan.tp, sp=plan.sequence_parallel, recompute=plan.recompute, e=e, k=k
    )


def backward_working_bytes(
    x: LayerShape, *, tp: int, sp: bool, recompute: Recompute, e: int, k: Kernels, attention: float = 0.0
) -> float:
    """Transient of one layer's backward on top of what is stored (MoE: plus the dispatch buffer). Inside
    the MLP, gradients of
    ``num_mlp_matrices`` ffn-wide tensors are alive at once (dL/d(product), dL/d(silu), dL/d(up)) while the
    product, the down projection's input, is already freed: a net ``num_mlp_matrices - 1`` ffn-wide tensors,
    plus the incoming ``sbh`` gradient (the CPU cross-check's MemTracker "Temp" peak). With recompute, the
    recomputed part of one layer: full, the whole layer but its stored input; selective, the attention
    core. ``attention``: what the layer's attention holds while it runs (context parallelism:
    ``cpbuffers.cp_attention_bytes``), at another moment of the layer than the MLP's temporaries."""
    side_div = tp if sp else 1
    net_ffn_tensors = (3 if x.gated else 2) - 1
    grads = x.s * x.b * (x.ffn * net_ffn_tensors / tp + x.h / side_div) * e
    # MoE dispatch buffer: the all-to-all receive buffer of one block's top-k token copies (Megatron-Core
    # token_dispatcher.py MoEAlltoAllTokenDispatcher: the dispatched tokens, then their gradients)
    grads += x.s * x.b * x.routed_peak / tp * e
    grads = max(grads, attention)
    if recompute is Recompute.NONE:
        return grads
    full_layer = layer_activation_bytes(x, tp=tp, sp=sp, recompute=Recompute.NONE, e=e, k=k)
    stored = layer_activation_bytes(x, tp=tp, sp=sp, recompute=recompute, e=e, k=k)
    return grads + full_layer - stored


def head_activation_bytes(
    x: LayerShape, *, tp: int, sp: bool, e: int, k: Kernels, first: bool, last: bool
) -> float:
    """Stored at the ends of the model per micro-batch (Korthikanti Sec. 4.3), logits excluded: the
    embedding's dropout mask on the first stage (token ids are negligible); the final norm's input,
    ``x*rstd`` if unfused, and output (the output layer's input) on the last stage. With sequence
    parallelism Megatron's output layer saves its local shard and gathers it again in backward
    (megatron/core/tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication``), torch TP
    (``Kernels.gathered_head_input``) saves the all-gathered input whole."""
    side_div = tp if sp else 1
    sbh = x.s * x.b * x.h
    stored = sbh * k.mask_bytes / side_div if (first and k.dropout) else 0.0
    if last:
        head_input_div = 1 if k.gathered_head_input else side_div
        stored += sbh * e * ((1 + (0 if k.fused_norm else 1)) / side_div + 1 / head_input_div)
    return stored
