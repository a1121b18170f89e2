"""The attention terms against benchmarks/results/gpu_kernels_h200.json (one H200, torch 2.11): the fa2 curves
are its SDPA flash measurements, and the model's CP-ring compute reproduces the ring replayed there."""

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.catalog import load_gpu, load_model, make_cluster
from autotune.costmodel import compute, kernels
from autotune.plan import ParallelPlan

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def measured():
    return json.loads((RESULTS / "gpu_kernels_h200.json").read_text())


@pytest.fixture(scope="module")
def measured_short():
    return json.loads((RESULTS / "gpu_kernels_gemm_h200.json").read_text())


@pytest.fixture(scope="module")
def sweep():
    return json.loads((RESULTS / "gpu_kernels_sweep_h200.json").read_text())["sdpa_sweep"]


@pytest.mark.parametrize("gpu", ["h200", "h100-sxm"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("backend", "kernel"), [("cudnn", "cudnn"), ("flash", "fa2")])
def test_the_attention_curves_are_the_measured_sdpa_rates(sweep, gpu, causal, backend, kernel):
    """Same GH100 compute on both cards; every curve point is the measured fraction of the bf16 peak of one
    run over 1k-32k tokens (benchmarks/results/gpu_kernels_sweep_h200.json)."""
    g = load_gpu(gpu)
    peak = g.bf16_flops / 1e12
    rows = [r for r in sweep if r["backend"] == backend and r["hd"] == 128 and r["causal"] is causal]
    assert len(rows) == 6
    for r in rows:
        fwd, bwd = kernels.attention_rates(g, kernel, r["s"], causal=causal)
        assert fwd / 1e12 / peak == pytest.approx(r["fwd_tflops"] / 989.4, abs=0.0015), r["s"]
        assert bwd / 1e12 / peak == pytest.approx(r["bwd_tflops_2x"] / 989.4, abs=0.0015), r["s"]


def test_the_swept_machine_sits_at_the_median_of_four(sweep, measured):
    """The causal cuDNN call at 4k and 8k on four H200 machines (gpu_block_h200.json, the first, fifth and
    sixth probe runs): the curve's run is within 5 % of their median in each direction."""
    import statistics

    block = json.loads((RESULTS / "gpu_block_h200.json").read_text())["attention"]
    heads = json.loads((RESULTS / "gpu_kernels_heads_h200.json").read_text())["sdpa_wide"]

    def rate(rows, s, key):
        return next(
            r[key] for r in rows if r["backend"] == "cudnn" and r["hd"] == 128 and r["causal"] and r["s"] == s
        )

    for s in (4096, 8192):
        b = next(r for r in block if r["s"] == s and r["heads"] == 32)
        fwd_all = [
            b["fwd_tflops_causal_half"],
            rate(measured["sdpa"], s, "fwd_tflops"),
            rate(heads, s, "fwd_tflops"),
        ]
        ours = rate(sweep, s, "fwd_tflops")
        assert ours == pytest.approx(statistics.median([*fwd_all, ours]), rel=0.05)
        bwd_all = [rate(measured["sdpa"], s, "bwd_tflops_2x"), rate(heads, s, "bwd_tflops_2x")]
        ours = rate(sweep, s, "bwd_tflops_2x")
        assert ours == pytest.approx(statistics.median([*bwd_all, ours]), rel=0.05)


def test_a_kernel_without_a_noncausal_curve_keeps_its_published_ratio_or_none():
    b200, h200 = load_gpu("b200"), load_gpu("h200")
    assert kernels.attention_rates(b200, "cudnn", 8192, causal=False) is None
    assert compute.ring_noncausal_speedup("cudnn", 8, b200, 32768) == (1.0, 1.0)
    assert compute.ring_noncausal_speedup("fa3", 2, h200, 32768) == pytest.approx(
        (1 / (0.5 + 0.5 / 1.046), 1 / (0.5 + 0.5 / 1.042))
    )
    # fa2 on H200 at 32k keys: non-causal 0.353 / 0.252 of peak against causal 0.343 / 0.255, blended by the
    # 7/8 of CP 8's work that runs in non-causal calls
    fwd, bwd = compute.ring_noncausal_speedup("fa2", 8, h200, 32768)
    assert fwd == pytest.approx(1 / (1 / 8 + 7 / 8 * 0.343 / 0.353), rel=1e-3)
    assert bwd == pytest.approx(1 / (1 / 8 + 7 / 8 * 0.255 / 0.252), rel=1e-3)


@pytest.mark.parametrize("case", range(8))
def test_the_ring_compute_matches_the_ring_replayed_on_an_h200(measured, case):
    """torch's load-balanced ring as torchtitan runs it (the last rank's calls, fp32 merges and gradient
    accumulation), Llama 3.1 8B and 405B at TP8, 32k tokens per rank, CP 1-8: the model's attention
    (``compute.attention_s`` with fa2) plus ``cpcomm.torch_ring_hbm_s`` within 6 % forward and backward.
    The ring cases were not used to set the curves (the square SDPA calls were)."""
    from benchmarks.gpu_kernels_report import ring_prediction

    r = measured["ring"]["cases"][case]
    fwd, bwd = ring_prediction(r)
    assert fwd == pytest.approx(r["fwd_s"], rel=0.06)
    assert bwd == pytest.approx(r["bwd_s"], rel=0.06)


def test_the_ring_costs_the_same_per_flop_at_every_cp(measured):
    """What the measurement says about torchtitan's CP table: the ring's compute per attention FLOP at CP 8
    is within 8 % of CP 1's, so its throughput loss beyond the FLOPs (8B: 3890 -> 548 tok/s/GPU) is not in
    the ring's kernels or merges."""
    for name in ("llama3-8b", "llama3-405b-tp8"):
        cases = {r["cp"]: r for r in measured["ring"]["cases"] if r["case"] == name}
        for key in ("fwd_tflops", "bwd_tflops_2x"):
            assert cases[8][key] / cases[1][key] > 0.92


def test_the_shape_curve_is_conservative_below_its_first_point(measured_short):
    """docs/speed_model.md, Known residuals: measured in isolation, narrow and short-k GEMMs run 2-5x faster
    than the curve's proportional fall-off below intensity 819 prices them; the measured rates are not
    adopted until the cost they would expose in published runs is found. Pinned here: no swept bf16 GEMM is
    priced more than 12 % faster than measured, and below intensity 300 every one is priced slower by at
    least 1.5x."""
    h200 = load_gpu("h200")
    for r in measured_short["gemm_shapes"]:
        m, k, n = r["m"], r["k"], r["n"]
        ratio = kernels.gemm_s(h200, "bf16", m, n, k) / r["bf16_s"]
        assert ratio > 0.88, r
        if kernels.intensity(m, n, k) < 300:
            assert ratio > 1.5, r


@pytest.mark.parametrize(("backend", "kernel"), [("cudnn", "cudnn"), ("flash", "fa2")])
def test_head_dim_64_runs_at_the_measured_fraction_of_head_dim_128(measured, backend, kernel):
    """The same FLOPs as 64 heads of 64 and 32 heads of 128 (SDPA, causal, 4k-32k): the median ratio is the
    catalog's head-dim-64 point; between it and 128 log2-linear."""
    import statistics

    def ratio(key):
        rows = {
            (r["hd"], r["s"]): r[key] for r in measured["sdpa"] if r["backend"] == backend and r["causal"]
        }
        return statistics.median(rows[(64, s)] / rows[(128, s)] for s in (4096, 8192, 16384, 32768))

    h200 = load_gpu("h200")
    fwd, bwd = kernels.head_dim_factor(h200, kernel, 64)
    assert fwd == pytest.approx(ratio("fwd_tflops"), abs=0.006)
    assert bwd == pytest.approx(ratio("bwd_tflops_2x"), abs=0.006)
    assert kernels.head_dim_factor(h200, kernel, 128) == (1.0, 1.0)
    assert kernels.head_dim_factor(h200, kernel, 32) == (fwd, bwd)  # flat below the narrowest measured
    mid = kernels.head_dim_factor(h200, kernel, 128 / 2**0.5)
    assert mid[0] == pytest.approx((1 + fwd) / 2)
    assert kernels.head_dim_factor(h200, "fa3", 64) == (1.0, 1.0)  # not measured


@pytest.mark.parametrize(
    ("backend", "kernel", "qk", "v"),
    [
        ("cudnn", "cudnn", 192, 192),
        ("cudnn", "cudnn", 256, 256),
        ("cudnn", "cudnn", 192, 128),
        ("flash", "fa2", 256, 256),
    ],
)
def test_wide_and_mla_heads_run_at_their_measured_fraction(backend, kernel, qk, v):
    """benchmarks/results/gpu_kernels_heads_h200.json: 4096 // d heads at 4k-8k against head dim 128 in the
    same run; MLA's 192-wide q/k with 128-wide v (DeepSeek-V3, cuDNN: FA2 needs equal widths) as measured, not
    interpolated from the equal-width points."""
    import statistics

    data = json.loads((RESULTS / "gpu_kernels_heads_h200.json").read_text())
    rows = [
        r
        for r in data["sdpa_wide"] + data["sdpa_mla"]
        if r["backend"] == backend and r["causal"] and "error" not in r
    ]

    def ratio(key):
        at = {(r["hd"], r["hd_v"], r["s"]): r[key] for r in rows}
        return statistics.median(at[(qk, v, s)] / at[(128, 128, s)] for s in (4096, 8192))

    fwd, bwd = kernels.head_dim_factor(load_gpu("h100-sxm"), kernel, qk, v)
    assert fwd == pytest.approx(ratio("fwd_tflops"), abs=0.006)
    assert bwd == pytest.approx(ratio("bwd_tflops_2x"), abs=0.006)


def test_a_head_dim_64_model_pays_the_slower_attention():
    """gpt-oss's attention (64 query heads of 64) on an H100 against the same FLOPs at head dim 128."""
    from autotune.costmodel import flops

    model = load_model("llama3-8b")
    narrow = dataclasses.replace(model, num_heads=64, num_kv_heads=8, attention_head_dim=64)
    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")
    plan = ParallelPlan(micro_batch=1, global_batch=8, seq_len=8192, dp=8, framework="megatron")
    assert flops.attention_flops_per_token(narrow, 8192) == flops.attention_flops_per_token(model, 8192)
    wide_fwd, wide_bwd = compute.attention_s(model, cluster, plan, 8192.0)
    fwd, bwd = compute.attention_s(narrow, cluster, plan, 8192.0)
    assert fwd == pytest.approx(wide_fwd / 0.70)
    assert bwd == pytest.approx(wide_bwd / 0.80)
