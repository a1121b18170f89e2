"""Device probe for step-time terms the catalog priced from others' figures (issues 22 and 23): torch's
context-parallel ring as torchtitan runs it, float8 GEMMs (tensorwise and rowwise ``torch._scaled_mm``),
grouped expert GEMMs (``torch._grouped_mm``), SDPA attention rates to 32k keys, and the narrow / short-``k``
GEMMs below the shape curve's first point.

Run on one GPU: ``python benchmarks/gpu_kernels.py OUT_DIR [--only=ring,sdpa,...]`` writes
OUT_DIR/gpu_kernels.json after every section (a section that fails records its error and the rest still
run). Without CUDA it runs tiny shapes on the CPU to check the code paths (``--dry-run`` forces that).
Timing: CUDA events, median of the timed repeats after warm-up. H200 results:
benchmarks/results/gpu_kernels_h200.json (``gemm_shapes`` alone: gpu_kernels_gemm_h200.json).

The ring section replays, on one GPU, the compute of the last CP rank of torch's load-balanced ring
(torch/distributed/tensor/experimental/_context_parallel/_attention.py ``_templated_ring_attention`` and
``_templated_ring_attention_backward`` with ``convert_to_f32``): step 0 causal over the local ``2 x
s/(2cp)`` chunks, the ``cp - 1`` later steps non-causal against the first half of the arriving K/V, each
output merged into an fp32 accumulator (``_SDPAMerger``), the K/V flattened for the rotation; backward the
same calls with dQ/dK/dV accumulated in fp32 and dK/dV flattened for their rotation. Only the exchange
itself is absent (one GPU), so this is the ring's compute as the cost model's ``attention_s`` and
``cpcomm.torch_ring_s`` merge terms price it."""

# ruff: noqa: B023  -- every closure below is called by timed() at once, inside its own loop iteration

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

CUDA = torch.cuda.is_available() and "--dry-run" not in sys.argv
DEV = "cuda" if CUDA else "cpu"
DT = torch.bfloat16
SCALE = 1 if CUDA else 64  # CPU dry run: every size / SCALE


def timed(fn, warmup: int = 2, iters: int = 5) -> float:
    """Median seconds of ``fn()`` (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    if not CUDA:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(out)


# ---------------------------------------------------------------- attention (SDPA flash / cuDNN)


def flash_fwd(q, k, v, causal: bool):
    """(out, lse, rest-for-backward) of one flash call: FA2 on CUDA, the CPU flash kernel in a dry run."""
    if CUDA:
        r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return r[0], r[1], r
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse, (out, lse)


def flash_bwd(dout, q, k, v, out, lse, rest, causal: bool):
    if CUDA:
        _, _, cq, ck, mq, mk, seed, off, _ = rest
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, off
        )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal
    )


def _qkv(heads: int, sq: int, sk: int, hd: int, b: int = 1):
    q = torch.randn(b, heads, sq, hd, device=DEV, dtype=DT)
    k = torch.randn(b, heads, sk, hd, device=DEV, dtype=DT)
    v = torch.randn(b, heads, sk, hd, device=DEV, dtype=DT)
    return q, k, v


def attention_call(heads: int, sq: int, sk: int, hd: int, causal: bool, b: int = 1) -> dict[str, float]:
    """One flash call, forward and backward timed apart. FLOPs: 4 sq sk hd per head forward (two GEMMs),
    halved when causal over a square; backward 2x that (the model's convention; flash-attention's is 2.5x)."""
    q, k, v = _qkv(heads, sq, sk, hd, b)
    out, lse, rest = flash_fwd(q, k, v, causal)
    dout = torch.randn_like(out)
    fwd = timed(lambda: flash_fwd(q, k, v, causal))
    bwd = timed(lambda: flash_bwd(dout, q, k, v, out, lse, rest, causal))
    work = 4.0 * b * heads * sq * sk * hd * (0.5 if causal else 1.0)
    return {
        "heads": heads,
        "sq": sq,
        "sk": sk,
        "hd": hd,
        "b": b,
        "causal": causal,
        "fwd_s": fwd,
        "bwd_s": bwd,
        "fwd_tflops": work / fwd / 1e12,
        "bwd_tflops_2x": 2 * work / bwd / 1e12,
    }


def sdpa_rates(
    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768),
    dims: tuple[int, ...] = (128, 64),
    v_dim: int | None = None,
    backends: tuple[str, ...] = ("flash", "cudnn"),
) -> list[dict[str, object]]:
    """SDPA through each backend on square causal and non-causal calls; ~32k tokens per call; ``4096 // d``
    heads of ``d`` (``v_dim``: another value width, as MLA's 192-wide q/k with 128-wide v)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows: list[dict[str, object]] = []
    known = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    chosen = [(name, known[name]) for name in backends]
    for hd, heads in [(d, 4096 // d) for d in dims]:
        hv = v_dim or hd
        for s in lengths:
            s //= SCALE
            b = max(1, 32768 // SCALE // s)
            q, k, _ = _qkv(heads, s, s, hd, b)
            v = torch.randn(b, heads, s, hv, device=DEV, dtype=DT)
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            g = torch.randn(b, heads, s, hv, device=DEV, dtype=DT)
            for causal in (True, False):
                for name, be in chosen if CUDA else chosen[:1]:
                    try:
                        with sdpa_kernel([be]):
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                            fb = timed(
                                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)
                            )
                    except RuntimeError as e:
                        rows.append(
                            {
                                "backend": name,
                                "hd": hd,
                                "hd_v": hv,
                                "s": s,
                                "causal": causal,
                                "error": str(e)[:200],
                            }
                        )
                        continue
                    work = 2.0 * b * heads * s * s * (hd + hv) * (0.5 if causal else 1.0)
                    bwd = max(fb - fwd, 1e-9)
                    rows.append(
                        {
                            "backend": name,
                            "hd": hd,
                            "hd_v": hv,
                            "heads": heads,
                            "b": b,
                            "s": s,
                            "causal": causal,
                            "fwd_s": fwd,
                            "fwd_bwd_s": fb,
                            "fwd_tflops": work / fwd / 1e12,
                            "bwd_tflops_2x": 2 * work / bwd / 1e12,
                        }
                    )
            print("sdpa", hd, hv, s, flush=True)
    return rows


# ---------------------------------------------------------------- torch's CP ring (compute of one rank)


def ring_forward(q, k, v, cp: int):
    """The last rank's ring forward (every later step: ``i <= rank``, the first half of the arriving K/V)."""
    out, lse, rest = flash_fwd(q, k, v, True)
    acc_out, acc_lse = out.float(), lse.unsqueeze(-1).float()
    saved = [(k, v, rest)]
    for _ in range(1, cp):
        torch.cat([k.flatten(), v.flatten()])  # flatten K/V for the rotation (torch sends cp - 1 times)
        kh, vh = k.chunk(2, dim=2)[0], v.chunk(2, dim=2)[0]
        o, lo, r = flash_fwd(q, kh, vh, False)
        o, lo = o.float(), lo.unsqueeze(-1).float()
        acc_out = acc_out - torch.sigmoid(lo - acc_lse) * (acc_out - o)
        acc_lse = acc_lse - F.logsigmoid(acc_lse - lo)
        saved.append((kh, vh, r))
    return acc_out.to(q.dtype), acc_lse.squeeze(-1), saved


def ring_backward(dout, q, k, v, out, lse, cp: int, saved):
    """The last rank's ring backward: one flash backward per step, fp32 accumulation of dQ, dK, dV
    (``_partial_update``'s chunk add and ``torch.cat`` on later steps) and the flatten for the rotation."""
    gq = torch.zeros_like(q, dtype=torch.float32)
    gk = torch.zeros_like(k, dtype=torch.float32)
    gv = torch.zeros_like(v, dtype=torch.float32)
    lse = lse.contiguous()
    nxt = None
    for i in range(cp):
        kk, vv, rest = saved[i]
        if i < cp - 1:
            torch.cat([k.flatten(), v.flatten()])
        gq_, gk_, gv_ = flash_bwd(dout, q, kk, vv, out, lse, rest, i == 0)
        if i == 0:
            gk += gk_
            gv += gv_
        else:
            ck, cv = list(gk.chunk(2, dim=2)), list(gv.chunk(2, dim=2))
            ck[0] += gk_
            cv[0] += gv_
            gk, gv = torch.cat(ck, dim=2), torch.cat(cv, dim=2)
        nxt = torch.cat([gk.flatten(), gv.flatten()])
        gq += gq_
    return gq.to(q.dtype), nxt.to(k.dtype)


def ring_case(name: str, heads: int, local: int, cp: int, hd: int = 128) -> dict[str, object]:
    q, k, v = _qkv(heads, local, local, hd)
    out, lse, saved = ring_forward(q, k, v, cp)
    dout = torch.randn_like(out)
    fwd = timed(lambda: ring_forward(q, k, v, cp), warmup=1, iters=3)
    bwd = timed(lambda: ring_backward(dout, q, k, v, out, lse, cp, saved), warmup=1, iters=3)
    work = 4.0 * heads * local * local * hd * 0.5 * cp  # step 0 causal square + (cp-1) half-size full calls
    return {
        "case": name,
        "heads": heads,
        "local_seq": local,
        "cp": cp,
        "hd": hd,
        "fwd_s": fwd,
        "bwd_s": bwd,
        "fwd_tflops": work / fwd / 1e12,
        "bwd_tflops_2x": 2 * work / bwd / 1e12,
    }


def ring() -> dict[str, object]:
    """torchtitan's Dec 2024 CP table: 32k tokens per rank at CP 1/2/4/8 (Llama 3.1 8B: 32 heads after
    ``repeat_kv``; 405B at TP8: 16), and the kernels a step runs, timed alone."""
    local = 32768 // SCALE
    res: dict[str, object] = {"cases": [], "calls": []}
    for heads, name in ((32, "llama3-8b"), (16, "llama3-405b-tp8")):
        heads_here = heads if CUDA else max(1, heads // 8)
        for cp in (1, 2, 4, 8):
            res["cases"].append(ring_case(name, heads_here, local, cp))
            print("ring", name, cp, flush=True)
        res["calls"].append(attention_call(heads_here, local, local, 128, True))
        res["calls"].append(attention_call(heads_here, local, local // 2, 128, False))
        res["calls"].append(attention_call(heads_here, local // 2, local, 128, False))
        res["calls"].append(attention_call(heads_here, local, local, 128, False))
    return res


# ---------------------------------------------------------------- float8 GEMMs


def _llama_linears(h: int, q_out: int, kv_out: int, f: int, tp: int) -> list[tuple[str, int, int]]:
    """(name, in, out) of a Llama block's linears after TP (QKV fused, gate+up fused)."""
    return [
        ("qkv", h, (q_out + 2 * kv_out) // tp),
        ("o", q_out // tp, h),
        ("w13", h, 2 * f // tp),
        ("w2", f // tp, h),
    ]


def fp8_gemms() -> list[dict[str, object]]:
    """bf16 ``mm`` vs ``torch._scaled_mm`` (e4m3 x e4m3 -> bf16, fast accumulation as torchao's forward)
    with one scale per tensor (tensorwise) and per row / column (rowwise), for the three GEMMs of each
    linear: forward ``T x in @ in x out``, input gradient ``T x out @ out x in``, weight gradient
    ``out x T @ T x in``. The casts are not included (the model prices them at HBM bandwidth)."""
    if not CUDA:
        return []
    fp8 = torch.float8_e4m3fn
    shapes = {
        "llama3-8b": _llama_linears(4096, 4096, 1024, 14336, 1),
        "llama3-70b-tp8": _llama_linears(8192, 8192, 1024, 28672, 8),
        "llama3-405b-tp8": _llama_linears(16384, 16384, 1024, 53248, 8),
    }
    rows: list[dict[str, object]] = []
    tokens = 8192
    for model, linears in shapes.items():
        for name, din, dout in linears:
            for role, (m, k, n) in {
                "fwd": (tokens, din, dout),
                "dgrad": (tokens, dout, din),
                "wgrad": (dout, tokens, din),
            }.items():
                a = torch.randn(m, k, device=DEV, dtype=DT)
                b = torch.randn(n, k, device=DEV, dtype=DT).t()  # column-major, as _scaled_mm wants
                t_bf16 = timed(lambda: a @ b)
                a8, b8 = a.to(fp8), b.to(fp8)
                one = torch.ones((), device=DEV)
                t_tw = timed(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=DT, use_fast_accum=True))
                sa = torch.ones(m, 1, device=DEV)
                sb = torch.ones(1, n, device=DEV)
                try:
                    t_rw = timed(lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=DT, use_fast_accum=True))
                except RuntimeError as e:
                    t_rw = math.nan
                    print("rowwise", e, flush=True)
                work = 2.0 * m * n * k
                rows.append(
                    {
                        "model": model,
                        "linear": name,
                        "role": role,
                        "m": m,
                        "k": k,
                        "n": n,
                        "bf16_s": t_bf16,
                        "fp8_tensorwise_s": t_tw,
                        "fp8_rowwise_s": t_rw,
                        "bf16_tflops": work / t_bf16 / 1e12,
                        "fp8_tensorwise_tflops": work / t_tw / 1e12,
                        "fp8_rowwise_tflops": work / t_rw / 1e12,
                    }
                )
        print("fp8", model, flush=True)
    return rows


# ---------------------------------------------------------------- grouped expert GEMMs


MOE_SHAPES = {
    # model: (hidden, expert ffn, local experts, routed tokens per local expert): a rank's share at 4096
    # tokens per micro-batch, balanced routing (tokens x top-k / experts-per-rank-group)
    "qwen3-30b-a3b-ep8": (2048, 768, 16, 2048),
    "qwen3-235b-a22b-ep32": (4096, 1536, 4, 8192),
    "deepseek-v3-ep64": (7168, 2048, 4, 8192),
    "gpt-oss-120b-ep8-mbs4": (2880, 2880, 16, 4096),
    "mixtral-8x7b-ep8-mbs2": (4096, 14336, 1, 16384),
}


def grouped_gemms() -> list[dict[str, object]]:
    """Expert MLP GEMMs of one rank (gate+up fused ``h -> 2f``, down ``f -> h``), three ways: one
    ``torch._grouped_mm`` (torchtitan's grouped experts), one ``mm`` per expert in a loop (what TE's
    ``general_grouped_gemm`` issues, on one stream here), and one dense GEMM over all routed tokens (the
    rate the model's shape curve gives). Forward, and forward + backward through autograd."""
    rows: list[dict[str, object]] = []
    for model, (h, f, experts, per_expert) in MOE_SHAPES.items():
        if not CUDA:
            h, f, per_expert = max(16, h // SCALE), max(16, f // SCALE), max(16, per_expert // SCALE)
        tokens = experts * per_expert
        offs = torch.arange(1, experts + 1, device=DEV, dtype=torch.int32) * per_expert
        for name, din, dout in (("w13", h, 2 * f), ("w2", f, h)):
            x = torch.randn(tokens, din, device=DEV, dtype=DT, requires_grad=True)
            w = torch.randn(experts, dout, din, device=DEV, dtype=DT).transpose(-2, -1).requires_grad_()
            wd = torch.randn(din, dout, device=DEV, dtype=DT, requires_grad=True)
            grad = torch.randn(
                tokens, dout, device=DEV, dtype=DT
            )  # contiguous: the grouped backward needs it
            work = 2.0 * tokens * din * dout
            row: dict[str, object] = {
                "model": model,
                "linear": name,
                "experts": experts,
                "m_per_expert": per_expert,
                "k": din,
                "n": dout,
            }

            def loop():
                return torch.cat([x[e * per_expert : (e + 1) * per_expert] @ w[e] for e in range(experts)])

            def grouped():
                return torch._grouped_mm(x, w, offs=offs)

            for key, fn in (("grouped", grouped), ("loop", loop), ("dense", lambda: x @ wd)):
                try:
                    fwd = timed(fn)
                    fb = timed(lambda: fn().backward(grad))
                    row[f"{key}_fwd_s"], row[f"{key}_fwd_bwd_s"] = fwd, fb
                    row[f"{key}_fwd_tflops"] = work / fwd / 1e12
                    row[f"{key}_fwd_bwd_tflops"] = 3 * work / fb / 1e12
                except RuntimeError as e:
                    row[f"{key}_error"] = str(e)[:200]
            rows.append(row)
        print("moe", model, flush=True)
    return rows


# ---------------------------------------------------------------- GEMM shapes below the curve's first point


def _skinny_shapes() -> list[tuple[str, int, int, int]]:
    """(what, m, k, n): the narrow and short-``k`` GEMMs of training: GQA K/V projections after TP8 (one
    128-wide KV head per rank) with their input- and weight-gradient GEMMs, MoE routers and small experts,
    and a width sweep at 8192 / 32768 / 131072 rows; an 8192^3 GEMM as this machine's reference."""
    shapes = [("square", 8192, 8192, 8192)]
    for rows in (8192, 32768, 131072):
        for width in (128, 256, 512, 1024, 2048):
            for k in (4096, 8192):
                shapes.append((f"narrow n={width}", rows, k, width))  # forward of a narrow output
                shapes.append((f"short k={width}", rows, width, k))  # its input gradient
        shapes.append(("router h=2048 E=128", rows, 2048, 128))
        shapes.append(("expert down k=768", rows, 768, 2048))
    for k in (8192, 32768, 131072):
        for width in (128, 512, 2048):
            shapes.append((f"wgrad m={width}", width, k, 4096))  # weight gradient of a narrow layer
    return shapes


def gemm_shapes() -> list[dict[str, object]]:
    """bf16 ``mm`` and fp8 tensorwise ``_scaled_mm`` over ``_skinny_shapes`` (operands row-major /
    column-major as torchao lays them out)."""
    rows: list[dict[str, object]] = []
    fp8 = torch.float8_e4m3fn
    for what, m, k, n in _skinny_shapes():
        if not CUDA:
            m, k, n = max(16, m // SCALE), max(16, k // SCALE), max(16, n // SCALE)
        a = torch.randn(m, k, device=DEV, dtype=DT)
        b = torch.randn(n, k, device=DEV, dtype=DT).t()
        row: dict[str, object] = {"what": what, "m": m, "k": k, "n": n}
        row["bf16_s"] = timed(lambda: a @ b)
        row["bf16_tflops"] = 2.0 * m * n * k / row["bf16_s"] / 1e12
        if CUDA:
            a8, b8, one = a.to(fp8), b.to(fp8), torch.ones((), device=DEV)
            row["fp8_s"] = timed(
                lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=DT, use_fast_accum=True)
            )
            row["fp8_tflops"] = 2.0 * m * n * k / row["fp8_s"] / 1e12
        rows.append(row)
    print("gemm shapes", len(rows), flush=True)
    return rows


def fp8_accum() -> list[dict[str, object]]:
    """``_scaled_mm`` with ``use_fast_accum=False`` (torchao's float8 backward GEMMs: ``grad_input`` and
    ``grad_weight`` accumulate in full precision), tensorwise and rowwise, on Llama 3 8B's and 70B-TP8's
    linears at 8192 tokens, next to the fast-accumulation forward."""
    if not CUDA:
        return []
    fp8, tokens = torch.float8_e4m3fn, 8192
    rows: list[dict[str, object]] = []
    linears = {
        "llama3-8b": _llama_linears(4096, 4096, 1024, 14336, 1),
        "llama3-70b-tp8": _llama_linears(8192, 8192, 1024, 28672, 8),
    }
    for model, layers in linears.items():
        for name, din, dout in layers:
            for role, (m, k, n) in {"dgrad": (tokens, dout, din), "wgrad": (dout, tokens, din)}.items():
                a8 = torch.randn(m, k, device=DEV, dtype=DT).to(fp8)
                b8 = torch.randn(n, k, device=DEV, dtype=DT).to(fp8).t()
                one, sa, sb = (
                    torch.ones((), device=DEV),
                    torch.ones(m, 1, device=DEV),
                    torch.ones(1, n, device=DEV),
                )
                row: dict[str, object] = {
                    "model": model,
                    "linear": name,
                    "role": role,
                    "m": m,
                    "k": k,
                    "n": n,
                }
                for key, (x, y) in {"tensorwise": (one, one), "rowwise": (sa, sb)}.items():
                    for fast in (True, False):
                        t = timed(lambda: torch._scaled_mm(a8, b8, x, y, out_dtype=DT, use_fast_accum=fast))
                        row[f"{key}_fast{int(fast)}_tflops"] = 2.0 * m * n * k / t / 1e12
                rows.append(row)
    print("fp8 accum", len(rows), flush=True)
    return rows


# ------------------------------------------------------- a TP rank's block linears; TE-style expert GEMMs

TP_BLOCKS = {
    # name: (hidden, q width, kv width, ffn, tokens) per TP rank, as torchtitan's Llama shards them
    # (wq / wk / wv / wo ColwiseParallel / RowwiseParallel, w1 / w3 / w2 likewise) at the published layouts
    "llama3-8b-tp8-mbs12": (4096, 512, 128, 1792, 12 * 8192),
    "llama3-70b-tp8-mbs16": (8192, 1024, 128, 3584, 16 * 8192),
    "llama3-405b-tp8-mbs1": (16384, 2048, 128, 6656, 8192),
    "llama3-8b-tp1-mbs2": (4096, 4096, 1024, 14336, 2 * 8192),
}


def tp_block_linears() -> list[dict[str, object]]:
    """Forward + backward (autograd: input and weight gradients) of one block's seven linears on one TP
    rank, in the order a block runs them, without attention: what the model's ``block_gemm_s`` x 3 prices,
    plus the few elementwise ops that join the linears (a residual add, the K/V stand-in for attention,
    the gate product)."""
    rows: list[dict[str, object]] = []
    for name, (h, qw, kvw, f, tokens) in TP_BLOCKS.items():
        if not CUDA:
            h, qw, kvw, f, tokens = (max(16, v // SCALE) for v in (h, qw, kvw, f, tokens))
        lin = {
            key: torch.randn(dout, din, device=DEV, dtype=DT, requires_grad=True)
            for key, din, dout in (
                ("wq", h, qw),
                ("wk", h, kvw),
                ("wv", h, kvw),
                ("wo", qw, h),
                ("w1", h, f),
                ("w3", h, f),
                ("w2", f, h),
            )
        }
        x = torch.randn(tokens, h, device=DEV, dtype=DT, requires_grad=True)

        def step():
            q, k, v = x @ lin["wq"].t(), x @ lin["wk"].t(), x @ lin["wv"].t()
            a = x + (q + torch.cat([k, v] * (qw // (2 * kvw) or 1), dim=1)[:, :qw]) @ lin["wo"].t()
            y = (a @ lin["w1"].t()) * (a @ lin["w3"].t())
            return y @ lin["w2"].t()

        out = step()
        grad = torch.randn_like(out)
        fwd = timed(step)
        fb = timed(lambda: step().backward(grad))
        work = 2.0 * tokens * sum(w.numel() for w in lin.values())
        rows.append(
            {
                "block": name,
                "h": h,
                "q": qw,
                "kv": kvw,
                "ffn": f,
                "tokens": tokens,
                "fwd_s": fwd,
                "fwd_bwd_s": fb,
                "fwd_tflops": work / fwd / 1e12,
                "fwd_bwd_tflops": 3 * work / fb / 1e12,
            }
        )
        print("tp block", name, flush=True)
    return rows


def te_style_experts() -> list[dict[str, object]]:
    """Each model's expert GEMMs as Transformer Engine's ``general_grouped_gemm`` issues them: one cuBLAS
    ``mm`` per local expert, round-robin over 4 CUDA streams (TE's default number of GEMM streams), joined
    at the end; forward GEMMs only, next to ``torch._grouped_mm`` on the same operands. Issued from Python
    the loop is host-bound at small experts; replayed from a CUDA graph (``graphed``) it is the GPU side
    alone, what TE's C++ loop approaches when the host keeps ahead."""
    if not CUDA:
        return []
    rows: list[dict[str, object]] = []
    streams = [torch.cuda.Stream() for _ in range(4)]
    for model, (h, f, experts, per_expert) in MOE_SHAPES.items():
        for name, din, dout in (("w13", h, 2 * f), ("w2", f, h)):
            x = torch.randn(experts * per_expert, din, device=DEV, dtype=DT)
            w = torch.randn(experts, dout, din, device=DEV, dtype=DT).transpose(-2, -1)
            offs = torch.arange(1, experts + 1, device=DEV, dtype=torch.int32) * per_expert
            out = torch.empty(experts * per_expert, dout, device=DEV, dtype=DT)

            def multi_stream():
                main = torch.cuda.current_stream()
                for s in streams:
                    s.wait_stream(main)
                for e in range(experts):
                    with torch.cuda.stream(streams[e % 4]):
                        torch.mm(
                            x[e * per_expert : (e + 1) * per_expert],
                            w[e],
                            out=out[e * per_expert : (e + 1) * per_expert],
                        )
                for s in streams:
                    main.wait_stream(s)

            t_ms = timed(multi_stream)
            t_g = timed(lambda: torch._grouped_mm(x, w, offs=offs))
            try:
                graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    multi_stream()
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph):
                    multi_stream()
                t_graph = timed(graph.replay)
            except RuntimeError as e:
                print("graph", e, flush=True)
                t_graph = math.nan
            work = 2.0 * experts * per_expert * din * dout
            rows.append(
                {
                    "model": model,
                    "linear": name,
                    "experts": experts,
                    "m_per_expert": per_expert,
                    "k": din,
                    "n": dout,
                    "multistream_s": t_ms,
                    "grouped_s": t_g,
                    "multistream_tflops": work / t_ms / 1e12,
                    "grouped_tflops": work / t_g / 1e12,
                    "graphed_s": t_graph,
                    "graphed_tflops": work / t_graph / 1e12,
                }
            )
    print("te-style experts", len(rows), flush=True)
    return rows


# ---------------------------------------------------------------- main


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out_dir = args[0] if args else os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "gpu_kernels.json")  # --only=a,b: those sections alone
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name() if CUDA else "cpu (dry run: tiny shapes)",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if CUDA else None,
    }
    if CUDA:
        res["clock_note"] = "no clock or power pinning: default application clocks, one run"
    sections = (
        ("ring", ring),
        ("fp8_gemm", fp8_gemms),
        ("grouped_gemm", grouped_gemms),
        ("sdpa", sdpa_rates),
        ("gemm_shapes", gemm_shapes),
        ("sdpa_short", lambda: sdpa_rates((1024, 2048), (128,))),
        ("sdpa_sweep", lambda: sdpa_rates((1024, 2048, 4096, 8192, 16384, 32768), (128,))),
        (
            "sdpa_wide",
            lambda: sdpa_rates((4096, 8192), (128, 192, 256), backends=("flash", "cudnn", "efficient")),
        ),
        (
            "sdpa_mla",
            lambda: sdpa_rates((4096, 8192), (192,), v_dim=128, backends=("flash", "cudnn", "efficient")),
        ),
        ("fp8_accum", fp8_accum),
        ("tp_block_linears", tp_block_linears),
        ("te_style_experts", te_style_experts),
    )
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    for name, fn in sections:
        if only and name not in only[0]:
            continue
        t = time.time()
        try:
            res[name] = fn()
        except Exception:  # a failed section is recorded; the others still run
            res[name] = {"error": traceback.format_exc()[-2000:]}
        res[f"{name}_wall_s"] = round(time.time() - t, 1)
        with open(path, "w") as fh:
            json.dump(res, fh, indent=1)
        print(name, "done in", res[f"{name}_wall_s"], "s", flush=True)
        if CUDA:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
