"""Kernel time of one transformer block's GEMMs and attention core, and of the LM head, for one micro-batch on
one GPU, from the shapes the plan gives each kernel (``kernels`` prices a kernel; ``flops`` counts work).

Convention: forward times; a GEMM's backward is its two gradient GEMMs of the same intensity (2x the forward,
``blocktime.BlockTimes.bwd_s``). fp8 plans run the block's linears in fp8 and pay their scaling casts
(``kernels.fp8_cast_bytes``, a third with the forward GEMMs, two thirds with the backward ones); the attention
core and the LM head stay 16-bit (Transformer Engine's fp8 autocast covers the layers' linears;
torchtitan's float8 converter skips ``output`` by ``filter_fqns``).
"""

from __future__ import annotations

from autotune import modelshape
from autotune.costmodel import flops, gemms, kernels
from autotune.costmodel.kernels import HBM_EFFICIENCY
from autotune.modelshape import qk_v_head_dims
from autotune.plan import Framework, LossKernel, ParallelPlan
from autotune.specs import ClusterSpec, GPUSpec, ModelSpec

__all__ = [
    "HBM_EFFICIENCY",
    "hbm_rate",
    "block_gemm_s",
    "attention_s",
    "head_gemm_s",
    "default_attention_kernel",
    "eager_extra_bytes_per_token",
    "op_sac_recompute_s",
    "eager_loss_extra_bytes_per_vocab",
    "ring_noncausal_speedup",
    "linear_attention_s",
]

FLASH_BWD_SLOWDOWN = {"h100-sxm": 1.6, "h100-pcie": 1.6, "h200": 1.6, "cpu": 1.2}
"""How much slower per FLOP (backward work = 2x the forward) a FlashAttention-2 backward runs than its
forward, by device (default ``FLASH_BWD_SLOWDOWN_DEFAULT``), where it has no measured attention curves
(``GPUSpec.attention_curves``). H200 through torch SDPA (causal, head dim 128, 4k-8k tokens): forward 555-601
TFLOP/s, backward 333-391, i.e. 1.5-1.7x. The CPU trial device keeps the 1.2 its committed landscape was
validated with (torch's CPU flash kernel has no published backward figure). Pre-FlashAttention kernels
(batched GEMMs) have no slowdown."""
FLASH_BWD_SLOWDOWN_DEFAULT = 1.45
"""GPUs without a figure of their own: the FA2 paper (Dao 2023, Sec. 4.1) on A100, forward up to 73 % of peak
and backward up to 63 % counted as 2.5x the forward FLOPs (flash-attention's
benchmarks/benchmark_flash_attention.py), i.e. 50 % of peak for the model's 2x: 73 / 50 = 1.45."""


EAGER_NORM_BYTES = 28
"""Extra HBM bytes per element of an RMSNorm run eagerly instead of fused: torchtitan's ``RMSNorm._norm``
(``x.float()``, ``pow``, ``mean``, ``* rsqrt``, ``type_as``, ``* weight``; torchtitan/models/llama3/model.py)
reads and writes 32 B per element in six kernels where a fused one reads and writes 4."""
EAGER_ROPE_BYTES = 16
"""Extra bytes per element of q and k for eager rotary embeddings (``float()``, ``view_as_complex``, complex
multiply, ``view_as_real``, ``type_as``: ~20 B against ~4 fused; torchtitan ``apply_rotary_emb``)."""
EAGER_SWIGLU_BYTES = 4
"""Extra bytes per MLP element for ``silu(w1 x) * w3 x`` as two kernels (10 B) instead of one (6 B)."""


def eager_extra_bytes_per_token(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """Forward HBM bytes per token and block that a torch model moves beyond the fused kernels
    ``flops.elementwise_bytes_per_token`` assumes (fsdp framework): without torch.compile its norms, RoPE
    and SwiGLU; with it still the RoPE, which torchtitan computes in complex numbers (``apply_rotary_emb``:
    ``view_as_complex``, complex multiply; torchtitan/models/llama3/model.py, models/common/rope.py today)
    and which inductor does not generate code for: it decomposes complex ``add`` only
    (torch/_inductor/decomposition.py) and runs the complex multiply as an eager fallback kernel between the
    fp32 casts (lowering.py ``_warn_complex_not_supported``; pytorch/torchtitan#15, "Performance may be worse
    than eager"), so the 20 B per q/k element of the eager path remain. Zero on a device whose eager
    operators are priced by their measured host time (``HostProfile.op_overhead_s``, the CPU trial device:
    ``costmodel.hostops`` holds them) and for Megatron/DeepSpeed (fused kernels)."""
    if plan.framework is not Framework.FSDP or cluster.gpu.host.op_overhead_s > 0:
        return 0.0
    h, kv, f, tp = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size, plan.tp
    rope = EAGER_ROPE_BYTES * (h + kv) / tp * model.softmax_share  # Gated DeltaNet layers have no RoPE
    if plan.compile:
        return rope
    norms = model.sublayers_per_layer * EAGER_NORM_BYTES * h / (tp if plan.sequence_parallel else 1)
    gate = EAGER_SWIGLU_BYTES * f / tp if model.gated_mlp else 0.0
    return norms + rope + gate


EAGER_LOSS_EXTRA_BYTES = 26
"""Extra HBM bytes per token and vocabulary entry of torchtitan's loss run eagerly,
``cross_entropy(pred.flatten(0, 1).float(), labels)`` (train.py at 9dec370, "compiling loss function causes
CUDA errors"; torchtitan/components/loss.py compiles it only with ``[compile] components`` holding "loss"),
over the fused loss ``flops.LOGITS_BYTES_PER_VOCAB`` (12 B) prices. One pass per kernel, at least: forward
``.float()`` (read 2, write 4), fp32 ``log_softmax`` (read 4, write 4); backward ``nll_loss_backward``'s
zero-filled fp32 gradient (write 4), ``log_softmax_backward`` (read 4 + 4, write 4), the cast back to 16 bits
(read 4, write 2): 36 B against the fused path's 10 beyond writing the logits."""


EAGER_BF16_LOSS_EXTRA_BYTES = 2
"""The same eager loss on the bf16 logits (``plan.loss_kernel`` bf16, AutoModel's ``MaskedCrossEntropy(
fp32_upcast=False)``): ``log_softmax`` (read 2, write 2), the zero-filled gradient (write 2),
``log_softmax_backward`` (read 2 + 2, write 2): 12 B against the fused path's 10."""


def eager_loss_extra_bytes_per_vocab(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """``EAGER_LOSS_EXTRA_BYTES`` (``EAGER_BF16_LOSS_EXTRA_BYTES`` for a bf16 loss) for a torch (fsdp
    framework) plan without torch.compile on a GPU; 0 for compiled plans, Megatron/DeepSpeed (fused or
    vocab-parallel fp32 kernels) and the CPU trial device, whose eager operators are priced by their
    measured host time (``costmodel.hostops``)."""
    if plan.framework is not Framework.FSDP or plan.compile or cluster.gpu.host.op_overhead_s > 0:
        return 0.0
    if plan.loss_kernel in (LossKernel.FUSED, LossKernel.CHUNKED):  # LOGITS_BYTES_PER_VOCAB's fused path
        return 0.0
    if plan.loss_kernel is LossKernel.BF16:
        return float(EAGER_BF16_LOSS_EXTRA_BYTES)
    return float(EAGER_LOSS_EXTRA_BYTES)


def hbm_rate(cluster: ClusterSpec) -> float:
    return cluster.gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY


def block_gemm_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float) -> float:
    """Forward seconds of one block's linears on ``tokens`` rows (``gemms.block_gemms``: after TP, EP and ETP,
    fused as the framework fuses them), each at its own shape's efficiency; fp8 plans add a third of their
    casts, TE comm+GEMM overlap a third of its SM margin (``ub_sm_margin_s``; forward + backward = 3x)."""
    gpu, precision = cluster.gpu, str(plan.precision)
    shapes = gemms.block_gemms(model, plan, tokens, fused=plan.framework is Framework.MEGATRON)
    s = sum(g.count * kernels.gemm_s(gpu, precision, g.m, g.n, g.k) for g in shapes)
    if precision == "fp8" and gpu.fp8_flops is not None:
        cast = kernels.fp8_cast_bytes(
            str(plan.fp8_recipe),
            fp8_operand_elements(model, plan, tokens),
            compiled=plan.compile or plan.framework is not Framework.FSDP,
        )
        s += (cast + rowwise_rescale_bytes(plan, shapes)) / hbm_rate(cluster) / 3
        s += fp8_linears(shapes) * kernels.FP8_LINEAR_FIXED_S / 3
    return s + ub_sm_margin_s(model, cluster, plan, tokens) / 3


def fp8_linears(shapes: list[gemms.Gemm]) -> float:
    """Linears of a block that pay ``kernels.FP8_LINEAR_FIXED_S``: one per GEMM entry and layer share, a
    grouped expert GEMM (one launch for its local experts) counted once."""
    return sum(min(g.count, 1.0) for g in shapes)


def op_sac_recompute_s(
    model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float, ew_s: float
) -> float:
    """Forward seconds one block reruns in its backward under torchtitan's per-op selective AC (what
    framework fsdp's ``selective`` emits; torchtitan/distributed/activation_checkpoint.py ``_apply_op_sac``,
    save list ``_op_sac_save_list`` in torchtitan/models/llama3/infra/parallelize.py): every second
    ``aten.mm`` of the block is recomputed (q, k, v, o, gate, up, down: k, o, up; GeLU MLP: k, o, down), each
    at its shape's efficiency at the plan's precision, with the forward share of its operands' fp8 casts as
    ``block_gemm_s`` counts them (torchao's amax, ``aten.max``, is saved; the cast is not), plus ``ew_s``,
    the block's forward memory-bound kernels (norms, RoPE, SiLU/mul, residual adds; eager extras included),
    none of which is saved. SDPA's outputs are saved: no attention core is rerun (memory side:
    ``activations.op_sac_bytes``). MoE blocks alternate over ``gemms.block_gemms``' list the same way."""
    gpu, precision = cluster.gpu, str(plan.precision)
    unsaved = gemms.block_gemms(model, plan, tokens, fused=False)[1::2]
    s = sum(g.count * kernels.gemm_s(gpu, precision, g.m, g.n, g.k) for g in unsaved)
    if precision == "fp8" and gpu.fp8_flops is not None:
        operands = sum(g.count * (g.m * g.k + g.n * g.k) for g in unsaved)
        cast = kernels.fp8_cast_bytes(str(plan.fp8_recipe), operands, compiled=plan.compile)
        s += cast / hbm_rate(cluster) / 3 + fp8_linears(unsaved) * kernels.FP8_LINEAR_FIXED_S / 3
    return s + ew_s


UB_OVERLAP_SMS = 16
"""SMs a Transformer Engine userbuffers overlap holds while it runs beside a GEMM, which then runs on the
rest (``set_sm_margin``): TE's default config (transformer_engine/pytorch/module/base.py ``initialize_ub``,
``get_default_config``: ``num_sm`` 16 for every method but ``ring_exchange``), which Megatron-LM's
``--tp-comm-overlap`` uses without ``--tp-comm-overlap-cfg``. By default ``proj_fprop`` / ``fc2_fprop``
reduce-scatter by the ``pipeline`` method and ``qkv_dgrad`` / ``qkv_wgrad`` / ``fc1_dgrad`` / ``fc1_wgrad``
by ``bulk``; the all-gathers before ``qkv_fprop`` / ``fc1_fprop`` and the backward of the row-parallel
layers use ``ring_exchange`` (copy engines, 1 SM). Megatron-Bridge's tuned configs
(src/megatron/bridge/training/comm_overlap.py) keep 16-32 SMs on the bf16 ``pipeline`` layers and 2-24 on
the ``bulk`` ones."""


def ub_sm_margin_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, tokens: float) -> float:
    """Extra forward+backward seconds of one block's GEMMs under ``plan.tp_comm_overlap`` from the SMs the
    overlapping collectives hold (``UB_OVERLAP_SMS``): the row-parallel forward GEMMs (``O``, MLP down) and
    the column-parallel backward ones (dgrad + wgrad of ``QKV`` and gate/up) run on ``sm_count - 16`` SMs.
    0 without the overlap, TP, or a known SM count."""
    sms = cluster.gpu.sm_count
    if not plan.tp_comm_overlap or plan.tp == 1 or not sms or sms <= UB_OVERLAP_SMS:
        return 0.0
    shapes = gemms.block_gemms(model, plan, tokens, fused=plan.framework is Framework.MEGATRON)
    if model.is_moe:  # the routed experts' GEMMs are not TP-overlapped (EP all-to-all: costmodel.moe)
        shapes = shapes[:-2]
    times = [
        (g.n == model.hidden_size, g.count * kernels.gemm_s(cluster.gpu, str(plan.precision), g.m, g.n, g.k))
        for g in shapes
    ]
    row = sum(t for is_row, t in times if is_row)  # row-parallel: the full hidden width comes out
    col = sum(t for is_row, t in times if not is_row)
    return (row + 2 * col) * (sms / (sms - UB_OVERLAP_SMS) - 1.0)


ROWWISE_RESCALE_BYTES = 4
"""HBM bytes per output element of a torchao rowwise float8 backward GEMM: ``grad_input`` and
``grad_weight`` run with ``use_fast_accum=False``, where the CUTLASS rowwise ``_scaled_mm`` was too slow, so
torchao runs the cuBLAS tensorwise GEMM and applies the row and column scales to its bf16 output in a separate
kernel (read 2 B, write 2 B) (torchao/float8/float8_ops.py ``addmm_float8_unwrapped``; pytorch/ao#2184: "at
least one extra triton kernel per GEMM ... just for the rescaling")."""


def rowwise_rescale_bytes(plan: ParallelPlan, shapes: list[gemms.Gemm]) -> float:
    """HBM bytes of the output rescaling of a torchao rowwise plan's backward GEMMs (``ROWWISE_RESCALE_BYTES``
    x the ``m x k`` input gradient and the ``n x k`` weight gradient of each linear); 0 for other recipes."""
    if str(plan.fp8_recipe) != "rowwise" or plan.framework is not Framework.FSDP:
        return 0.0
    return ROWWISE_RESCALE_BYTES * sum(g.count * (g.m * g.k + g.n * g.k) for g in shapes)


def fp8_tp_gather(plan: ParallelPlan) -> bool:
    """Whether the column-parallel inputs are cast to fp8 before the sequence-parallel all-gather, so it moves
    1-byte values: tensor-scaled recipes only (torchtitan ``enable_float8_tensorwise_tp``, not for rowwise:
    torchtitan/models/llama3/infra/parallelize.py; Transformer Engine's fp8 all-gather of the LayerNormLinear
    input)."""
    return (
        str(plan.precision) == "fp8"
        and plan.sequence_parallel
        and str(plan.fp8_recipe) in ("tensorwise", "delayed")
    )


def fp8_operand_elements(model: ModelSpec, plan: ParallelPlan, tokens: float) -> float:
    """Entries one block casts to fp8 per micro-batch: its four distinct GEMM inputs (attention and MLP
    inputs are shared by Q/K/V and gate/up, cast once; cast on the sequence shard before an fp8 all-gather,
    ``fp8_tp_gather``), every weight, and every GEMM's output gradient. MoE blocks also cast the routed
    copies each expert multiplies (``gemms.block_gemms``)."""
    h, tp = model.hidden_size, plan.tp
    shapes = gemms.block_gemms(model, plan, tokens, fused=plan.framework is Framework.MEGATRON)
    col_rows = tokens / tp if fp8_tp_gather(plan) else tokens
    # the output projections' input: attention's heads, Gated DeltaNet's V, Mamba-2's d_in
    q_width = model.num_heads * qk_v_head_dims(model)[1] * model.softmax_share
    q_width += modelshape.linear_widths(model)[1] * model.linear_share
    q_width += modelshape.mamba_widths(model)[0] * model.mamba_share
    dense_ffn = modelshape.active_ffn_per_layer(model) - modelshape.routed_ffn_per_layer(model)
    inputs = col_rows * model.sublayers_per_layer * h + tokens * (q_width + dense_ffn) / tp
    routed = sum(g.m * g.k * g.count for g in shapes[-2:]) if model.is_moe else 0.0
    return inputs + routed + sum(g.count * (g.n * g.k + g.m * g.n) for g in shapes)


def head_gemm_s(model: ModelSpec, cluster: ClusterSpec, vocab_split: int, tokens: float) -> float:
    """Forward seconds of the LM head GEMM (``tokens x h`` by ``h x V/split``), 16-bit."""
    return kernels.gemm_s(cluster.gpu, "bf16", tokens, model.vocab_size / vocab_split, model.hidden_size)


def default_attention_kernel(cluster: ClusterSpec) -> str:
    """``cudnn`` where the GPU has measured curves: Transformer Engine's fused attention (Megatron) and torch
    SDPA on Hopper run cuDNN-class kernels, which is what the H200 curve measured through torch SDPA."""
    return "cudnn"


NONCAUSAL_SPEEDUP = {"fa3": (1.046, 1.042)}
"""(forward, backward) rate of a non-causal attention call over a causal one of the same length, by kernel,
where the GPU has no measured non-causal curve (``kernels.attention_rates(causal=False)``): FA3 at head dim
128, seqlen 8192 on an H100, flash-attention's hopper/benchmark_attn.py (output in
Dao-AILab/flash-attention#1791), 659.1 / 630.0 TF forward and 553.9 / 531.6 backward. A kernel without
either (cudnn) gets 1."""


def ring_noncausal_speedup(
    kernel: str, cp: int, gpu: GPUSpec | None = None, seq_kv: float | None = None
) -> tuple[float, float]:
    """(forward, backward) rate multiple of a load-balanced causal CP ring's attention calls over the causal
    curve: its first step is causal, the ``cp - 1`` later ones non-causal over the half chunks that are
    needed (TE ``AttnFuncWithCPAndKVP2P``, torch ``_templated_ring_attention``), i.e. ``1 - 1/cp`` of the
    work; harmonic blend by that share of the non-causal/causal rate ratio at the ring's chunk length
    ``seq_kv`` on ``gpu``'s measured curves, else ``NONCAUSAL_SPEEDUP``."""
    ratio = NONCAUSAL_SPEEDUP.get(kernel, (1.0, 1.0))
    if gpu is not None and seq_kv is not None:
        causal = kernels.attention_rates(gpu, kernel, seq_kv)
        full = kernels.attention_rates(gpu, kernel, seq_kv, causal=False)
        if causal is not None and full is not None:
            ratio = (full[0] / causal[0], full[1] / causal[1])
    share = 1.0 - 1.0 / max(1, cp)
    fwd, bwd = ratio
    return 1.0 / (1.0 - share + share / fwd), 1.0 / (1.0 - share + share / bwd)


def attention_s(
    model: ModelSpec,
    cluster: ClusterSpec,
    plan: ParallelPlan,
    tokens: float,
    *,
    flash: bool = True,
    kernel: str | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds of one block's attention core for ``tokens`` queries of this rank over
    ``plan.seq_len`` keys; a FlashAttention-class kernel (``flash``) skips the causal mask's upper tiles
    (``flops.CAUSAL_ATTENTION_FRACTION``). On a GPU with measured
    curves each kernel runs at its rate for the key length one kernel call sees: the whole sequence, or with
    context parallelism one ring step's chunk, ``s / cp`` (Megatron/TE ``AttnFuncWithCPAndKVP2P``, torch
    ``context_parallel``: one call per step). Elsewhere: ``gemm_efficiency`` and ``FLASH_BWD_SLOWDOWN``."""
    gpu = cluster.gpu
    causal = flops.CAUSAL_ATTENTION_FRACTION if flash else 1.0
    work = tokens * flops.attention_flops_per_token(model, plan.seq_len, causal_fraction=causal) / plan.tp
    kernel = kernel or default_attention_kernel(cluster)
    rates = kernels.attention_rates(gpu, kernel, plan.seq_len / plan.cp, head_dims=qk_v_head_dims(model))
    half = gpu.bf16_flops or gpu.fp16_flops or gpu.fp32_flops or 1.0
    peak = half if str(plan.precision) == "fp8" else (gpu.peak_flops(str(plan.precision)) or half)
    tensor_rate = peak * gpu.gemm_efficiency * kernels.clock_factor(gpu)
    lin = linear_attention_s(model, cluster, tokens / plan.tp, tensor_rate)
    if rates is not None and flash:
        fwd_x, bwd_x = ring_noncausal_speedup(kernel, plan.cp, gpu, plan.seq_len / plan.cp)
        return work / (rates[0] * fwd_x) + lin, 2 * work / (rates[1] * bwd_x) + 2 * lin
    fwd = work / tensor_rate
    slowdown = FLASH_BWD_SLOWDOWN.get(gpu.key, FLASH_BWD_SLOWDOWN_DEFAULT) if flash else 1.0
    return fwd + lin, 2 * slowdown * fwd + 2 * lin


def linear_attention_s(model: ModelSpec, cluster: ClusterSpec, tokens: float, tensor_rate: float) -> float:
    """Forward seconds of the mean block's chunked gated delta rule and Mamba-2 SSD scan for ``tokens``
    tokens of this rank (heads split over TP): the slower of their FLOPs
    (``flops.linear_attention_flops_per_token``) at the GPU's GEMM rate and their bytes
    (``flops.linear_attention_bytes_per_token``) at HBM speed; the backward is priced at twice it.
    **Not measured**: FLA's and mamba_ssm's Triton kernels were not timed on a GPU here; at Qwen3-Next's
    shapes the bytes bind (about 1 ns per token and value head on an H100)."""
    work = tokens * flops.linear_attention_flops_per_token(model)
    if not work:
        return 0.0
    return max(work / tensor_rate, tokens * flops.linear_attention_bytes_per_token(model) / hbm_rate(cluster))
