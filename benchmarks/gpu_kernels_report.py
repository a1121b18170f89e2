"""The device probe's results against the cost model: ``python benchmarks/gpu_kernels_report.py`` reads
benchmarks/results/gpu_kernels_{h200,gemm_h200,block_h200,experts_h200,heads_h200,sweep_h200}.json
(``benchmarks/gpu_kernels.py`` on one H200, six runs on six machines) and writes
benchmarks/results/gpu_kernels_h200.md: the CP ring's compute, SDPA rates by length and head dim, float8,
grouped expert, narrow / short-``k`` GEMMs and a TP rank's block linears, each measured next to what
``autotune`` predicts for the same call on an ``h200``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from autotune.catalog import load_gpu, load_model, make_cluster
from autotune.costmodel import compute, cpcomm, kernels
from autotune.plan import ParallelPlan

RESULTS = Path(__file__).parent / "results"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def ring_prediction(case: dict) -> tuple[float, float]:
    """The model's (forward, backward) seconds for one replayed ring case of ``gpu_kernels.ring``: the
    attention calls (``compute.attention_s`` with fa2) and the ring's merges / fp32 accumulation
    (``cpcomm.torch_ring_hbm_s``), on an ``h200`` at the case's CP and tokens per rank."""
    is_8b = case["case"] == "llama3-8b"
    model = load_model("llama3-8b" if is_8b else "llama3-405b")
    tp, cp, local = (1 if is_8b else 8), case["cp"], float(case["local_seq"])
    plan = ParallelPlan(
        tp=tp,
        cp=cp,
        dp=2,
        micro_batch=1,
        global_batch=2,
        seq_len=int(local) * cp,
        framework="fsdp",
        sharding="fsdp-full",
    )
    cluster = make_cluster(num_gpus=2 * tp * cp, gpu="h200")
    fwd, bwd = compute.attention_s(model, cluster, plan, local, kernel="fa2")
    merge, acc = cpcomm.torch_ring_hbm_s(model, cluster, plan, local) if cp > 1 else (0.0, 0.0)
    return fwd + merge, bwd + acc


def ring_rows(data: dict) -> list[str]:
    lines = [
        "| model (heads per rank) | CP | measured fwd ms | predicted | error | measured bwd ms | predicted |"
        " error | fwd TF | bwd TF (2x) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["ring"]["cases"]:
        cp = r["cp"]
        pf, pb = ring_prediction(r)
        lines.append(
            f"| {r['case']} ({r['heads']}) | {cp} | {1e3 * r['fwd_s']:.1f} | {1e3 * pf:.1f} | "
            f"{_pct(pf / r['fwd_s'] - 1)} | {1e3 * r['bwd_s']:.1f} | {1e3 * pb:.1f} | "
            f"{_pct(pb / r['bwd_s'] - 1)} | {r['fwd_tflops']:.0f} | {r['bwd_tflops_2x']:.0f} |"
        )
    return lines


def sdpa_rows(data: dict) -> list[str]:
    lines = [
        "| backend | head dim | tokens | causal | fwd TF | bwd TF (2x) | fwd / peak | bwd / peak |",
        "|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in data["sdpa"]:
        dims = f"{r['hd']}" if r.get("hd_v", r["hd"]) == r["hd"] else f"{r['hd']} / v {r['hd_v']}"
        if "error" in r:
            lines.append(f"| {r['backend']} | {dims} | {r['s']} | {r['causal']} | no kernel | | | |")
            continue
        lines.append(
            f"| {r['backend']} | {dims} | {r['s']} | {r['causal']} | {r['fwd_tflops']:.0f} | "
            f"{r['bwd_tflops_2x']:.0f} | {r['fwd_tflops'] / 989.4:.3f} | {r['bwd_tflops_2x'] / 989.4:.3f} |"
        )
    return lines


def fp8_rows(data: dict) -> tuple[list[str], list[str]]:
    h200 = load_gpu("h200")
    lines = [
        "| model | linear | GEMM | m x k x n | bf16 TF | fp8 tensorwise TF | fp8 rowwise TF | tw / bf16 |"
        " rw / tw | predicted bf16 | predicted fp8 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    err_b, err_8, speed, rw = [], [], [], []
    for r in data["fp8_gemm"]:
        m, k, n = r["m"], r["k"], r["n"]
        pb, p8 = kernels.gemm_s(h200, "bf16", m, n, k), kernels.gemm_s(h200, "fp8", m, n, k)
        err_b.append(pb / r["bf16_s"] - 1)
        err_8.append(p8 / r["fp8_tensorwise_s"] - 1)
        speed.append(r["bf16_s"] / r["fp8_tensorwise_s"])
        rw.append(r["fp8_tensorwise_s"] / r["fp8_rowwise_s"])
        lines.append(
            f"| {r['model']} | {r['linear']} | {r['role']} | {m} x {k} x {n} | {r['bf16_tflops']:.0f} | "
            f"{r['fp8_tensorwise_tflops']:.0f} | {r['fp8_rowwise_tflops']:.0f} | {speed[-1]:.2f} | "
            f"{rw[-1]:.2f} | {_pct(err_b[-1])} | {_pct(err_8[-1])} |"
        )
    summary = [
        f"- {len(speed)} GEMMs: fp8 tensorwise runs {statistics.median(speed):.2f}x bf16 (median; "
        f"{min(speed):.2f}-{max(speed):.2f}); rowwise {statistics.median(rw):.2f}x tensorwise "
        f"({min(rw):.2f}-{max(rw):.2f}): the GEMM itself costs rowwise nothing on this torch.",
        f"- Predicted time vs measured: bf16 median {_pct(statistics.median(err_b))} "
        f"({_pct(min(err_b))} to {_pct(max(err_b))}); fp8 tensorwise median {_pct(statistics.median(err_8))} "
        f"({_pct(min(err_8))} to {_pct(max(err_8))}). The model's fp8 GEMM is set by torchao's compiled "
        "float8 linear microbenchmark (casts included, `fp8_gemm_scale`); these are the bare `_scaled_mm`s.",
    ]
    return lines, summary


def grouped_rows(data: dict) -> list[str]:
    h200 = load_gpu("h200")
    lines = [
        "| model | linear | experts x tokens | k x n | grouped TF | per-expert loop TF | one dense GEMM TF |"
        " grouped fwd+bwd TF | predicted (per-expert GEMMs) vs grouped |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["grouped_gemm"]:
        e, mpe, k, n = r["experts"], r["m_per_expert"], r["k"], r["n"]
        pred = e * kernels.gemm_s(h200, "bf16", mpe, n, k)
        lines.append(
            f"| {r['model']} | {r['linear']} | {e} x {mpe} | {k} x {n} | {r['grouped_fwd_tflops']:.0f} | "
            f"{r['loop_fwd_tflops']:.0f} | {r['dense_fwd_tflops']:.0f} | {r['grouped_fwd_bwd_tflops']:.0f} | "
            f"{_pct(pred / r['grouped_fwd_s'] - 1)} |"
        )
    return lines


def shape_rows(data: dict) -> tuple[list[str], list[str]]:
    """Every GEMM of the shape sweep, and its intensity bins against the shape curve."""
    h200 = load_gpu("h200")
    lines = [
        "| GEMM | m x k x n | intensity | bf16 TF | x gemm_efficiency | predicted bf16 | fp8 TF |"
        " predicted fp8 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    bins: dict[tuple[int, int], list[tuple[float, float]]] = {
        (100, 150): [],
        (200, 300): [],
        (400, 600): [],
        (700, 950): [],
    }
    for r in data["gemm_shapes"]:
        m, k, n = r["m"], r["k"], r["n"]
        ai = kernels.intensity(m, n, k)
        factor = r["bf16_tflops"] / (h200.bf16_flops / 1e12) / h200.gemm_efficiency
        pb, p8 = kernels.gemm_s(h200, "bf16", m, n, k), kernels.gemm_s(h200, "fp8", m, n, k)
        lines.append(
            f"| {r['what']} | {m} x {k} x {n} | {ai:.0f} | {r['bf16_tflops']:.0f} | {factor:.2f} | "
            f"{_pct(pb / r['bf16_s'] - 1)} | {r['fp8_tflops']:.0f} | {_pct(p8 / r['fp8_s'] - 1)} |"
        )
        model = kernels.gemm_efficiency(h200, "bf16", m, n, k) / h200.gemm_efficiency
        for (lo, hi), pairs in bins.items():
            if lo <= ai < hi and r["what"] != "square":
                pairs.append((factor, model))
    summary = [
        "| intensity | GEMMs | measured x gemm_efficiency: mean (min-max) | the model's, mean |",
        "|---|---:|---|---:|",
    ]
    for (lo, hi), pairs in bins.items():
        got = [f for f, _ in pairs]
        summary.append(
            f"| {lo}-{hi} | {len(got)} | {statistics.mean(got):.2f} ({min(got):.2f}-{max(got):.2f}) | "
            f"{statistics.mean(m for _, m in pairs):.2f} |"
        )
    return lines, summary


def fp8_accum_rows(data: dict) -> list[str]:
    lines = [
        "| model | linear | GEMM | m x k x n | tensorwise fast / full accum TF |"
        " rowwise fast / full accum TF |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["fp8_accum"]:
        lines.append(
            f"| {r['model']} | {r['linear']} | {r['role']} | {r['m']} x {r['k']} x {r['n']} | "
            f"{r['tensorwise_fast1_tflops']:.0f} / {r['tensorwise_fast0_tflops']:.0f} | "
            f"{r['rowwise_fast1_tflops']:.0f} / {r['rowwise_fast0_tflops']:.0f} |"
        )
    return lines


def block_rows(data: dict) -> list[str]:
    """A TP rank's seven block linears, forward + backward through autograd, against the model's GEMMs."""
    h200 = load_gpu("h200")
    lines = [
        "| block (per TP rank) | tokens | measured fwd+bwd ms | predicted GEMMs ms | error |"
        " of which K/V ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in data["tp_block_linears"]:
        h, qw, kvw, f, t = r["h"], r["q"], r["kv"], r["ffn"], r["tokens"]
        shapes = [(t, qw, h), (t, kvw, h), (t, kvw, h), (t, h, qw), (t, f, h), (t, f, h), (t, h, f)]
        per = [
            kernels.gemm_s(h200, "bf16", m, n, k)
            + kernels.gemm_s(h200, "bf16", m, k, n)
            + kernels.gemm_s(h200, "bf16", n, k, m)
            for m, n, k in shapes
        ]
        lines.append(
            f"| {r['block']} | {t} | {1e3 * r['fwd_bwd_s']:.1f} | {1e3 * sum(per):.1f} | "
            f"{_pct(sum(per) / r['fwd_bwd_s'] - 1)} | {1e3 * (per[1] + per[2]):.1f} |"
        )
    return lines


def te_rows(data: dict) -> list[str]:
    lines = [
        "| model | linear | experts x tokens | k x n | 4 streams, from Python TF | 4 streams, CUDA graph TF |"
        " torch._grouped_mm TF | predicted (per-expert GEMMs) vs graph |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    h200 = load_gpu("h200")
    for r in data["te_style_experts"]:
        e, mpe, k, n = r["experts"], r["m_per_expert"], r["k"], r["n"]
        pred = e * kernels.gemm_s(h200, "bf16", mpe, n, k)
        lines.append(
            f"| {r['model']} | {r['linear']} | {e} x {mpe} | {k} x {n} | {r['multistream_tflops']:.0f} | "
            f"{r['graphed_tflops']:.0f} | {r['grouped_tflops']:.0f} | {_pct(pred / r['graphed_s'] - 1)} |"
        )
    return lines


def main() -> int:
    data = json.loads((RESULTS / "gpu_kernels_h200.json").read_text())
    second = json.loads((RESULTS / "gpu_kernels_gemm_h200.json").read_text())
    third = json.loads((RESULTS / "gpu_kernels_block_h200.json").read_text())
    fourth = json.loads((RESULTS / "gpu_kernels_experts_h200.json").read_text())
    fifth = json.loads((RESULTS / "gpu_kernels_heads_h200.json").read_text())
    sixth = json.loads((RESULTS / "gpu_kernels_sweep_h200.json").read_text())
    shape_table, shape_summary = shape_rows(second)
    fp8_table, fp8_summary = fp8_rows(data)
    lines = [
        f"# Device probe: {data['device']}, torch {data['torch']}, CUDA {data['cuda']}, "
        f"cuDNN {data['cudnn']}",
        "",
        "Measured by `python benchmarks/gpu_kernels.py OUT` (its docstring: what each section runs and how it"
        " is timed), compared by `python benchmarks/gpu_kernels_report.py`. One run, default clocks"
        " (700 W, SM clock 1980 MHz after the run). Predicted = the cost model on an `h200` for the same"
        " call.",
        "",
        "## torch's context-parallel ring, one rank's compute",
        "",
        "The last rank of torch's load-balanced ring with 32k tokens per rank (torchtitan's CP table): step 0"
        " causal, `cp - 1` half-size non-causal calls, fp32 merges; backward with fp32 dQ/dK/dV"
        " accumulation. Predicted = `compute.attention_s(kernel='fa2')` + `cpcomm.torch_ring_hbm_s`; the"
        " exchange itself is not on one GPU. The fa2 curves were set from the square SDPA calls below, not"
        " from these.",
        "",
        *ring_rows(data),
        "",
        "Per attention FLOP the ring at CP 8 runs within 7 % of CP 1: its kernels and merges do not explain"
        " the throughput torchtitan loses with CP (docs/speed_model.md).",
        "",
        "## SDPA attention (batch x tokens = 32k)",
        "",
        *sdpa_rows(data),
        "",
        "## float8 GEMMs (`torch._scaled_mm`, e4m3, bf16 output, fast accumulation) vs bf16, 8192 tokens",
        "",
        *fp8_summary,
        "",
        *fp8_table,
        "",
        "## Grouped expert GEMMs (bf16, balanced routing)",
        "",
        "`torch._grouped_mm` is torchtitan's grouped experts kernel; the per-expert loop runs one `mm` per"
        " expert on one stream (its backward goes through autograd's slicing, so it is not what Transformer"
        " Engine's grouped GEMM costs); the dense GEMM is all routed tokens against one expert-sized matrix.",
        "",
        *grouped_rows(data),
        "",
        "## Second run (another machine): narrow and short-k GEMMs, SDPA at 1k-2k, fp8 accumulation",
        "",
        "### GEMMs below the shape curve's first point (bf16, and fp8 tensorwise `_scaled_mm`)",
        "",
        "The shape curve (`gemm_shape_curve`) has no point below intensity 819; there the model lets the"
        " efficiency fall in proportion to the intensity. Measured, averaged by intensity:",
        "",
        *shape_summary,
        "",
        *shape_table,
        "",
        "### SDPA at 1k and 2k tokens (batch x tokens = 32k)",
        "",
        *sdpa_rows({"sdpa": second["sdpa_short"]}),
        "",
        "### fp8 with fast vs full-precision accumulation (`use_fast_accum`)",
        "",
        *fp8_accum_rows(second),
        "",
        "## Third and fourth runs (two more machines): a TP rank's block linears, expert GEMMs on 4 streams",
        "",
        "### One block's seven linears on one TP rank, forward + backward through autograd",
        "",
        "torchtitan's Llama sharding (separate wq / wk / wv: one 128-wide KV head per rank at TP8) at the"
        " published layouts' tokens per micro-batch, without attention; measured includes the few"
        " elementwise ops that join the linears (residual add, gate product). Predicted = the model's 21"
        " GEMMs (forward, input and weight gradient of each linear) on an `h200`.",
        "",
        *block_rows(third),
        "",
        "### Expert GEMMs, one `mm` per expert round-robin over 4 CUDA streams (fourth run)",
        "",
        "Transformer Engine's grouped GEMM issues one cuBLAS GEMM per expert from C++. Issued from Python the"
        " loop pays tens of microseconds of host time per expert, so where experts are small (Qwen3-30B) it"
        " measures the host; replayed from a CUDA graph it is the GPU side alone.",
        "",
        *te_rows(fourth),
        "",
        "## Fifth run (another machine): SDPA at head dims 128, 192, 256 and MLA's 192 / v 128",
        "",
        "4096 // d heads (equal FLOPs), batch x tokens = 32k. The catalog's `attention_head_dim` is the"
        " median ratio to head dim 128 of this run (64: the first run's 4k-32k).",
        "",
        *sdpa_rows({"sdpa": fifth["sdpa_wide"] + fifth["sdpa_mla"]}),
        "",
        "## Sixth run (another machine): SDPA at head dim 128, 1k-32k",
        "",
        "The `cudnn`, `cudnn-noncausal`, `fa2` and `fa2-noncausal` curves of h100-sxm and h200 are this run.",
        "",
        *sdpa_rows({"sdpa": sixth["sdpa_sweep"]}),
        "",
    ]
    (RESULTS / "gpu_kernels_h200.md").write_text("\n".join(lines))
    print("\n".join(lines[:40]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
