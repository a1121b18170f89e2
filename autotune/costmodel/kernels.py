"""What one kernel reaches on a GPU: GEMM efficiency by shape and dtype, fp8 scaling traffic, attention
kernels by sequence length, and the clock a power-capped card runs at.

Conventions: an efficiency is a fraction of the dtype's dense peak (``GPUSpec.peak_flops``). Curves are GPU
data (``data/hardware.yaml``: ``gemm_shape_curve``, ``attention``), measured (benchmarks/gpu_block.py on an
H200, results in benchmarks/results/gpu_block_h200.json) or read from a cited public benchmark; a GPU without
a curve runs every shape at its calibrated ``gemm_efficiency`` (the A100/V100 rows of
benchmarks/results/published_runs.md validate that). Nothing here is per model or per run.
"""

from __future__ import annotations

import math

from autotune.specs import GPUSpec

__all__ = [
    "HBM_EFFICIENCY",
    "intensity",
    "gemm_efficiency",
    "gemm_s",
    "fp8_cast_bytes",
    "fp8_intensity",
    "FP8_LINEAR_FIXED_S",
    "attention_rates",
    "head_dim_factor",
    "NONCAUSAL_SUFFIX",
    "clock_factor",
    "FP8_CAST_BYTES",
    "ATTENTION_KERNELS",
    "POWER_CLOCK_EXPONENT",
]

HBM_EFFICIENCY = 0.8
"""Fraction of the HBM peak a streaming kernel reaches: a device-to-device copy moved 4.14 of 4.8 TB/s on an
H200 (0.86, measured with torch); STREAM-like kernels reach ~0.8 on A100
(`autotune probe --device cuda` measures it)."""
POWER_CLOCK_EXPONENT = 1 / 3
"""How the sustained clock follows a board power limit below the TDP: dynamic power is ``C V^2 f`` and in
the DVFS range the voltage scales with the clock, so power goes as ``f^3`` and the clock as
``(limit / tdp)^(1/3)`` (Hennessy & Patterson, Computer Architecture 6th ed., Sec. 1.5). Applied to compute
rates only; HBM bandwidth does not follow the core clock."""

FP8_CAST_BYTES: dict[str, float] = {
    "delayed": 4.0,
    "tensorwise": 6.0,
    "rowwise": 8.0,
    "blockwise": 8.0,
    "mx": 6.0,
}
"""HBM bytes per element of each fp8 GEMM operand (input, weight, output gradient) per forward+backward, to
scale and cast it from bf16 (compiled / fused kernels):

- ``delayed`` (Transformer Engine delayed scaling): the scale is last step's amax, so one fused
  cast-transpose reads 2 B and writes the fp8 tensor and its transpose (1 + 1 B)
  (transformer_engine/common/transpose/cast_transpose.cu);
- ``tensorwise`` (TE current scaling, torchao dynamic tensorwise): an amax pass first (read 2 B), then the
  same cast-transpose (read 2, write 2);
- ``rowwise`` (torchao rowwise, per-row scales) and ``blockwise`` (1x128 / 128x128 tiles): a scale along one
  axis of the forward GEMM and along the other for the backward ones, so each operand is quantised twice from
  bf16: a fused per-row pass (read 2, write 1) and a per-column one with its own amax pass (read 2 + 2, write
  1) (torchao/float8/float8_linear.py with ``Float8LinearConfig.from_recipe_name("rowwise")``);
- ``mx`` (MXFP8, 32-element blocks along both axes on Blackwell): two fused passes (read 2, write 1 each).
Without torch.compile torchao's amax, cast and transpose run as separate kernels: ``EAGER_CAST_FACTOR``."""
EAGER_CAST_FACTOR = 1.5
"""Unfused torchao casts (no torch.compile): amax, scale, cast and transpose each re-read the bf16 tensor
(the torchao float8 README: "enable torch.compile to generate fused kernels for float8 scaling and
casting")."""
FP8_LINEAR_FIXED_S = 19e-6
"""GPU seconds an fp8 linear's scaling kernels take, forward + backward, whatever its size: the amax and cast
passes of its input, weight and output gradient are six to nine extra kernels (torchao/float8/float8_linear.py
under compile; Transformer Engine's cast-transpose and amax kernels likewise), each paying a launch-to-finish
floor of 2-3 us on a small tensor. The figure is the one that puts the torchao float8 README's small example
(M,K,N = 1024,2048,1024: 0.80x bf16 on an H100) where it was measured, with its large one (1.39x) setting
``fp8_gemm_scale``; at the GEMM sizes of training (milliseconds per linear) it is under a percent."""
ATTENTION_KERNELS = ("cudnn", "fa2", "fa3", "efficient")


def intensity(m: float, n: float, k: float) -> float:
    """Arithmetic intensity of an ``m x k`` by ``k x n`` GEMM in FLOPs per 16-bit operand byte, ``mnk /
    (mk + kn + mn)``; the same for the three GEMMs of a linear layer (forward, input and weight gradient)."""
    return m * n * k / (m * k + k * n + m * n)


def fp8_intensity(m: float, n: float, k: float) -> float:
    """Where an fp8 GEMM sits on a 16-bit intensity curve: its FLOPs per byte moved (1-byte inputs, 16-bit
    output: ``2 m n k / (m k + k n + 2 m n)``) against twice the peak, ``m n k / (m k + k n + 2 m n)``. The
    same compute-to-traffic balance relative to its peak as a 16-bit GEMM of that intensity (the roofline,
    Williams et al. 2009): a large square GEMM sits at 3/4 of its 16-bit intensity, a short-``k`` one whose
    16-bit output dominates the traffic near 1/2, a narrow-``n`` one near 1."""
    return m * n * k / (m * k + k * n + 2 * m * n)


def _interp_log(points: tuple[tuple[float, float], ...], x: float, *, below_proportional: bool) -> float:
    """Piecewise-linear in ``log x`` through ``points``; flat past the last point; below the first either flat
    or proportional to ``x`` (``below_proportional``)."""
    if x <= points[0][0]:
        return points[0][1] * (x / points[0][0] if below_proportional else 1.0)
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


def clock_factor(gpu: GPUSpec) -> float:
    """Compute slowdown of a card capped below its TDP: ``(power_limit / tdp)^POWER_CLOCK_EXPONENT``."""
    if gpu.tdp_w and gpu.power_limit_w and gpu.power_limit_w < gpu.tdp_w:
        return (gpu.power_limit_w / gpu.tdp_w) ** POWER_CLOCK_EXPONENT
    return 1.0


def gemm_efficiency(gpu: GPUSpec, precision: str, m: float, n: float, k: float) -> float:
    """Fraction of the ``precision`` peak one GEMM reaches: ``gemm_efficiency`` x the GPU's shape curve at
    the GEMM's intensity (fp8: at ``fp8_intensity``, or at ``fp8_intensity_factor`` x the 16-bit one where
    the GPU data sets it, x ``fp8_gemm_scale``), x ``clock_factor``.
    Below the smallest measured intensity the efficiency falls in proportion: the torchao float8
    microbenchmark's small linear (M,K,N = 1024,2048,1024: fp8 0.80x bf16) needs it; ``gemm_s`` floors a
    skinny GEMM at its streaming time."""
    eff = gpu.gemm_efficiency * clock_factor(gpu)
    fp8 = precision == "fp8" and gpu.fp8_flops is not None
    if gpu.gemm_shape_curve:
        if not fp8:
            ai = intensity(m, n, k)
        elif gpu.fp8_intensity_factor is None:
            ai = fp8_intensity(m, n, k)
        else:
            ai = intensity(m, n, k) * gpu.fp8_intensity_factor
        eff *= _interp_log(gpu.gemm_shape_curve, ai, below_proportional=True)
    return eff * (gpu.fp8_gemm_scale if fp8 else 1.0)


def gemm_s(gpu: GPUSpec, precision: str, m: float, n: float, k: float) -> float:
    """Seconds of one ``m x k`` by ``k x n`` GEMM: its FLOPs at ``gemm_efficiency``, or, for a skinny GEMM
    below the GPU's ridge, the time to stream its operands (1 B fp8 / 2 B inputs, 16-bit output) at
    ``HBM_EFFICIENCY`` (the roofline, Williams et al. 2009). A GPU without the dtype runs it at its 16-bit
    peak. Below the curve's first point the efficiency falls with the intensity, i.e. the time goes with the
    bytes moved; there an fp8 GEMM takes at most the 16-bit one's time x its share of the bytes, so no shape
    runs slower in fp8 than in 16 bits (its casts are priced apart, ``fp8_cast_bytes``)."""
    half = gpu.bf16_flops or gpu.fp16_flops or gpu.fp32_flops or 1.0
    peak = gpu.peak_flops(precision) or half
    dtype = precision if gpu.peak_flops(precision) else "bf16"
    in_bytes = 1 if dtype == "fp8" else 2
    moved = in_bytes * (m * k + k * n) + 2 * m * n
    stream_s = moved / (gpu.memory_bandwidth_bytes_per_s * HBM_EFFICIENCY)
    s = max(2.0 * m * n * k / (peak * gemm_efficiency(gpu, dtype, m, n, k)), stream_s)
    if dtype == "fp8":
        s = min(s, gemm_s(gpu, "bf16", m, n, k) * moved / (2 * (m * k + k * n) + 2 * m * n))
    return s


def fp8_cast_bytes(recipe: str, elements: float, *, compiled: bool = True) -> float:
    """HBM bytes to scale and cast ``elements`` fp8 GEMM operand entries for their forward and backward GEMMs
    (``FP8_CAST_BYTES``)."""
    return FP8_CAST_BYTES[recipe] * (1.0 if compiled or recipe == "delayed" else EAGER_CAST_FACTOR) * elements


NONCAUSAL_SUFFIX = "-noncausal"
"""An attention curve named ``<kernel>-noncausal`` holds that kernel's rates on calls without the causal mask
(a load-balanced CP ring's later steps)."""


def attention_rates(
    gpu: GPUSpec,
    kernel: str,
    seq_kv: float,
    *,
    causal: bool = True,
    head_dims: tuple[float, float] = (128, 128),
) -> tuple[float, float] | None:
    """(forward, backward) FLOP/s of the attention core with ``kernel`` over ``seq_kv`` keys per query, from
    the GPU's measured curves (``_attention_rates``), remembered per GPU object: a search asks the same few
    questions of one GPU for every plan."""
    key = (kernel, seq_kv, causal, head_dims)
    memo = _RATES.get(id(gpu))
    if memo is None or memo[0] is not gpu:  # a new GPU object (the id of a freed one may come back)
        if len(_RATES) > 64:
            _RATES.clear()
        memo = _RATES[id(gpu)] = (gpu, {})
    rates = memo[1].get(key, _MISSING)
    if rates is _MISSING:
        rates = memo[1][key] = _attention_rates(gpu, kernel, seq_kv, causal, head_dims)
    return rates  # type: ignore[return-value]


_RATES: dict[int, tuple[GPUSpec, dict[tuple[object, ...], tuple[float, float] | None]]] = {}
_MISSING = object()


def _attention_rates(
    gpu: GPUSpec, kernel: str, seq_kv: float, causal: bool, head_dims: tuple[float, float]
) -> tuple[float, float] | None:
    """(forward, backward) FLOP/s of the attention core with ``kernel`` over ``seq_kv`` keys per query, from
    the GPU's measured curves (16-bit peak x fraction x ``clock_factor``), at the q/k and v ``head_dims``
    (``head_dim_factor``); None where the GPU has none (for ``causal=False``: no ``<kernel>-noncausal``
    curve)."""
    curves = {name: (fwd, bwd) for name, fwd, bwd in gpu.attention_curves}
    name = kernel if causal else kernel + NONCAUSAL_SUFFIX
    if name not in curves:
        return None
    half = (gpu.bf16_flops or gpu.fp16_flops or 1.0) * clock_factor(gpu)
    fwd, bwd = curves[name]
    fwd_x, bwd_x = head_dim_factor(gpu, kernel, *head_dims)
    return (
        half * fwd_x * _interp_log(fwd, seq_kv, below_proportional=False),
        half * bwd_x * _interp_log(bwd, seq_kv, below_proportional=False),
    )


def head_dim_factor(
    gpu: GPUSpec, kernel: str, qk_dim: float, v_dim: float | None = None
) -> tuple[float, float]:
    """(forward, backward) rate of ``kernel`` with ``qk_dim``-wide queries and keys and ``v_dim``-wide values
    (default: the same) over its head-dim-128 curve, from the GPU's ``attention_head_dim``: a measured pair
    as measured; otherwise ``log2``-linear in the mean width between the measured equal-width pairs and 128
    (1, 1), flat beyond the widest and narrowest. 1 where the kernel has no figures."""
    v_dim = qk_dim if v_dim is None else v_dim
    pairs = {
        (float(qk), float(v)): (fwd, bwd)
        for name, qk, v, fwd, bwd in gpu.attention_head_dim
        if name == kernel
    }
    if not pairs:
        return 1.0, 1.0
    if (qk_dim, v_dim) in pairs:
        return pairs[(qk_dim, v_dim)]
    line = sorted([(128.0, 1.0, 1.0)] + [(qk, f, b) for (qk, v), (f, b) in pairs.items() if qk == v])
    width = (qk_dim + v_dim) / 2
    fwd = _interp_log(tuple((d, f) for d, f, _ in line), width, below_proportional=False)
    bwd = _interp_log(tuple((d, b) for d, _, b in line), width, below_proportional=False)
    return fwd, bwd
