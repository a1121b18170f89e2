"""Kernel efficiency by shape, dtype, sequence length and power, pinned to the measurements it comes from."""

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.catalog import load_gpu, load_model, make_cluster
from autotune.costmodel import compute, cpcomm, kernels
from autotune.plan import ParallelPlan

H200_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_block_h200.json"


def test_a_gpu_without_curves_runs_every_shape_at_its_calibrated_efficiency():
    a100 = load_gpu("a100-80gb")
    for m, n, k in ((8192, 8192, 8192), (4096, 1280, 8192), (2048, 2048, 2048)):
        assert kernels.gemm_efficiency(a100, "bf16", m, n, k) == pytest.approx(0.70)


def test_h200_curve_reproduces_the_measured_llama_gemms():
    """benchmarks/results/gpu_block_h200.json: 12 bf16 GEMMs of Llama 8B / 70B layers on one H200."""
    h200, rows = load_gpu("h200"), json.loads(H200_JSON.read_text())["gemm"]
    for group in rows.values():
        for r in group["rows"]:
            m, n, k = r["m"], r["n"], r["k"]
            predicted = 2 * m * n * k / kernels.gemm_s(h200, "bf16", m, n, k) / 1e12
            assert predicted == pytest.approx(r["tflops"], rel=0.08), r


def test_fp8_linear_speedup_matches_the_torchao_microbenchmark():
    """torchao/float8/README.md: a compiled tensorwise float8 linear runs 1.39x its bf16 forward+backward at
    M,K,N = 4096,8192,16384 and 0.80x at 1024,2048,1024 on an H100."""
    h100 = load_gpu("h100-sxm")
    hbm = h100.memory_bandwidth_bytes_per_s * kernels.HBM_EFFICIENCY

    def speedup(m, k, n):
        bf16 = 3 * kernels.gemm_s(h100, "bf16", m, n, k)
        fp8 = (
            3 * kernels.gemm_s(h100, "fp8", m, n, k)
            + kernels.fp8_cast_bytes("tensorwise", m * k + k * n + m * n) / hbm
            + kernels.FP8_LINEAR_FIXED_S
        )
        return bf16 / fp8

    assert speedup(4096, 8192, 16384) == pytest.approx(1.39, abs=0.03)
    assert speedup(1024, 2048, 1024) == pytest.approx(0.80, abs=0.05)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "b200"])
def test_an_fp8_gemm_is_never_slower_than_the_16bit_one_of_its_shape(gpu):
    """Was: Hopper placed fp8 at half the 16-bit intensity, below the curve's first point, so the TP-sliced
    GEMMs of an 8B model at TP8 (n = 768 or k = 512 over 98k rows) ran slower in fp8 than in bf16, and fp8
    tensorwise gained nothing there while torchtitan measured +16 % (benchmarks/results/modern_runs.md).
    An fp8 GEMM moves fewer bytes for the same FLOPs at twice the peak; the casts are priced apart."""
    g = load_gpu(gpu)
    rows = 12 * 8192
    tp8 = [(rows, 768, 4096), (rows, 4096, 512), (rows, 3584, 4096), (rows, 4096, 1792)]
    for m, n, k in [*tp8, (1024, 1024, 2048)]:
        assert kernels.gemm_s(g, "fp8", m, n, k) < kernels.gemm_s(g, "bf16", m, n, k), (m, n, k)


def test_fp8_sits_where_its_operand_bytes_put_it():
    square = (8192, 8192, 8192)
    assert kernels.fp8_intensity(*square) == pytest.approx(0.75 * kernels.intensity(*square))
    short_k = (98304, 4096, 512)
    assert kernels.fp8_intensity(*short_k) / kernels.intensity(*short_k) == pytest.approx(0.53, abs=0.01)


def test_scaling_recipes_cost_what_their_passes_move():
    e = 1e9
    costs = [kernels.fp8_cast_bytes(r, e) for r in ("delayed", "tensorwise", "rowwise")]
    assert costs == sorted(costs) and costs[0] < costs[-1]
    assert kernels.fp8_cast_bytes("tensorwise", e, compiled=False) > kernels.fp8_cast_bytes("tensorwise", e)


def test_no_gemm_beats_streaming_its_operands():
    a100 = load_gpu("a100-80gb")
    m, n, k = 98304, 16, 4096  # skinny: a few output columns over many tokens
    stream = (2 * (m * k + k * n) + 2 * m * n) / (a100.memory_bandwidth_bytes_per_s * kernels.HBM_EFFICIENCY)
    assert kernels.gemm_s(a100, "bf16", m, n, k) == pytest.approx(stream)
    assert kernels.gemm_s(load_gpu("h100-sxm"), "bf16", m, n, k) >= stream * 3350 / 2039


def test_a_power_capped_card_computes_slower_but_streams_as_fast():
    h100 = load_gpu("h100-sxm")
    capped = dataclasses.replace(h100, power_limit_w=500.0)
    assert kernels.clock_factor(capped) == pytest.approx((500 / 700) ** (1 / 3))
    assert kernels.clock_factor(dataclasses.replace(h100, tdp_w=None, power_limit_w=500.0)) == 1.0
    big = (16384, 16384, 16384)
    assert kernels.gemm_s(capped, "bf16", *big) == pytest.approx(
        kernels.gemm_s(h100, "bf16", *big) / kernels.clock_factor(capped)
    )


def test_attention_curves_agree_with_the_first_h200_sdpa_measurement():
    """gpu_block_h200.json's SDPA calls, another machine than the curve's run (gpu_kernels_sweep_h200.json):
    within 10 % (the four machines measured spread 10 % at 4k)."""
    h200, runs = load_gpu("h200"), json.loads(H200_JSON.read_text())["attention"]
    for r in runs:
        fwd, _ = kernels.attention_rates(h200, "cudnn", r["s"])
        assert fwd / 1e12 == pytest.approx(r["fwd_tflops_causal_half"], rel=0.10)
    fa2, fa3 = kernels.attention_rates(h200, "fa2", 16384), kernels.attention_rates(h200, "fa3", 16384)
    assert fa2[0] < fa3[0] and fa2[1] < fa3[1]  # FlashAttention-3 paper: 1.5-2x FA2 on Hopper
    assert kernels.attention_rates(load_gpu("a100-80gb"), "cudnn", 4096) is None


def test_long_context_attention_is_priced_by_the_kernel_each_ring_step_runs():
    model, cluster = load_model("7b"), make_cluster(num_gpus=16, gpu="h100-sxm")
    plan = ParallelPlan(
        tp=4, cp=4, global_batch=4, seq_len=131072, framework="megatron", sequence_parallel=True
    )
    tokens = plan.seq_len / plan.cp
    fa2 = compute.attention_s(model, cluster, plan, tokens, kernel="fa2")
    cudnn = compute.attention_s(model, cluster, plan, tokens, kernel="cudnn")
    assert fa2[0] > cudnn[0] and fa2[1] > cudnn[1]


def test_context_parallel_exchange_modes():
    """p2p hides behind the ring's attention steps; allgather only behind the local chunk; Ulysses a2a
    hides nothing."""
    model, cluster = load_model("7b"), make_cluster(num_gpus=16, gpu="h100-sxm")
    base = ParallelPlan(
        tp=4, cp=4, global_batch=4, seq_len=131072, framework="megatron", sequence_parallel=True
    )
    tokens = base.seq_len / base.cp
    fwd, bwd = compute.attention_s(model, cluster, base, tokens)
    exposed = {
        mode: cpcomm.cp_exposed_s(model, cluster, base.replace(cp_comm=mode), tokens, fwd, bwd)
        for mode in ("p2p", "allgather", "a2a")
    }
    assert exposed["p2p"] <= exposed["allgather"] and exposed["a2a"] > 0
    assert cpcomm.cp_exposed_s(model, cluster, base.replace(cp=1, dp=4), tokens, fwd, bwd) == 0.0


def test_blackwell_curve_is_the_xla_table_it_cites():
    """hardware.yaml's b200 / gb200 gemm_shape_curve is what benchmarks/blackwell_gemm_curve.py derives from
    XLA's per-shape B200 table (benchmarks/data/xla_matmul_b200_h100.csv)."""
    from benchmarks import blackwell_gemm_curve as derive

    derived = derive.curve(derive.load_table())
    for key in ("b200", "gb200"):
        stored = load_gpu(key).gemm_shape_curve
        assert len(stored) == len(derived)
        for (a, m), (da, dm) in zip(stored, derived, strict=True):
            assert a == pytest.approx(da, rel=0.01) and m == pytest.approx(dm, abs=0.01)


def test_blackwell_fills_late_and_runs_fp8_at_its_bf16_fraction():
    """On B200 a mid-size GEMM sits well below a large one (XLA table: 0.47 vs 0.74 of peak for 16384 rows
    with n = k = 1024 vs 4096), and fp8 reaches the bf16 fraction at the same shape, where Hopper's fp8 sits
    at half the intensity on its curve."""
    b200, h100 = load_gpu("b200"), load_gpu("h100-sxm")
    small, large = (16384, 1024, 1024), (16384, 4096, 4096)
    eff = kernels.gemm_efficiency
    assert eff(b200, "bf16", *small) < 0.65 * eff(b200, "bf16", *large)
    for shape in (small, large, (8192, 28672, 8192)):
        assert kernels.gemm_efficiency(b200, "fp8", *shape) == pytest.approx(
            kernels.gemm_efficiency(b200, "bf16", *shape)
        )
    assert kernels.gemm_efficiency(h100, "fp8", *large) < 0.9 * kernels.gemm_efficiency(h100, "bf16", *large)


def test_blackwell_attention_curves_are_the_published_cudnn_benchmark():
    """b200 / gb200 ``cudnn`` curves are NVIDIA's cuDNN SDPA training benchmark on a B200 (benchmarks/data/
    cudnn_sdpa_blackwell.csv: causal, head dim 128, 128 query heads; one cuDNN release for both dies) in the
    model's convention: causal work halved, the backward counted as 2x the forward FLOPs (the source counts
    2.5x)."""
    import csv

    path = H200_JSON.parents[1] / "data" / "cudnn_sdpa_blackwell.csv"
    rows = list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))
    for key in ("b200", "gb200"):
        gpu = load_gpu(key)
        fwd, bwd = dict(gpu.attention_curves[0][1]), dict(gpu.attention_curves[0][2])
        points = [r for r in rows if r["gpu"] == "b200" and float(r["seq"]) in fwd]
        assert len(points) == len(fwd) >= 7
        b200_peak = load_gpu("b200").bf16_flops
        for r in points:
            s = float(r["seq"])
            work = 4 * s * s * 128 * 128 / 2
            fwd_s, bwd_s = float(r["forward_ms"]) / 1e3, float(r["backward_ms"]) / 1e3
            assert fwd[s] * b200_peak == pytest.approx(work / fwd_s, rel=0.01)
            assert bwd[s] * b200_peak == pytest.approx(2 * work / bwd_s, rel=0.01)
            assert bwd[s] < 0.75 * fwd[s]  # the backward is the slow half on Blackwell


def test_blackwell_ultra_attention_curves_are_the_published_gb300_run():
    """gb300 / b300 ``cudnn`` curves are the same benchmark run on a GB300 with b200's cuDNN release (9.13,
    torch nv25.09), as fractions of each GPU's own peak; Blackwell Ultra's doubled exponential units make its
    layer faster than B200's at every length from 4k."""
    import csv

    path = H200_JSON.parents[1] / "data" / "cudnn_sdpa_blackwell.csv"
    rows = list(csv.DictReader(line for line in path.read_text().splitlines() if not line.startswith("#")))
    gb300 = {float(r["seq"]): r for r in rows if r["gpu"] == "gb300"}
    b200 = {float(r["seq"]): r for r in rows if r["gpu"] == "b200"}
    peak = load_gpu("gb300").bf16_flops
    for key in ("gb300", "b300"):
        gpu = load_gpu(key)
        fwd, bwd = dict(gpu.attention_curves[0][1]), dict(gpu.attention_curves[0][2])
        assert len(fwd) == len(bwd) >= 7 and set(fwd) <= set(gb300)
        for s in fwd:
            work = 4 * s * s * 128 * 128 / 2
            assert fwd[s] * peak == pytest.approx(work / (float(gb300[s]["forward_ms"]) / 1e3), rel=0.01)
            assert bwd[s] * peak == pytest.approx(2 * work / (float(gb300[s]["backward_ms"]) / 1e3), rel=0.01)
            if s >= 4096:
                assert float(gb300[s]["forward_ms"]) < 0.85 * float(b200[s]["forward_ms"])


def test_torch_sdpas_memory_efficient_kernel_runs_mla_at_its_measured_rate():
    """benchmarks/results/gpu_kernels_heads_h200.json: at 4k keys the efficient backend runs head dim 128 at
    154.8 TF forward / 96.2 backward (2x convention) on one H200, MLA's 192 / 128 at 0.82 / 0.31 of that; the
    flash backend has no kernel for unequal widths and runs 128 at 2.2x the efficient forward."""
    for name in ("h100-sxm", "h200"):
        gpu = load_gpu(name)
        fwd, bwd = kernels.attention_rates(gpu, "efficient", 4096)
        assert fwd == pytest.approx(154.8e12, rel=0.01) and bwd == pytest.approx(96.2e12, rel=0.01)
        mla = kernels.attention_rates(gpu, "efficient", 4096, head_dims=(192, 128))
        assert mla == pytest.approx((0.82 * fwd, 0.31 * bwd), rel=1e-6)
        fa2 = kernels.attention_rates(gpu, "fa2", 4096)
        assert fa2[0] > 1.8 * fwd and fa2[1] > 2 * bwd
        assert kernels.attention_rates(gpu, "efficient", 4096, causal=False)[0] > fwd  # no masked tiles
