"""The GEMM sections of the device probe (``benchmarks/gpu_kernels.py``, which runs them): float8 GEMMs
(tensorwise / rowwise ``torch._scaled_mm``, fast and full accumulation), grouped expert GEMMs
(``torch._grouped_mm``, and one GEMM per expert over four streams as Transformer Engine issues them), the
narrow / short-``k`` GEMMs below the shape curve's first point, and a TP rank's block linears."""

# ruff: noqa: B023  -- every closure below is called by timed() at once, inside its own loop iteration

from __future__ import annotations

import math

import torch

from benchmarks._gpu_timing import CUDA, DEV, DT, SCALE, timed

# ---------------------------------------------------------------- float8 GEMMs


def _llama_linears(h: int, q_out: int, kv_out: int, f: int, tp: int) -> list[tuple[str, int, int]]:
    """(name, in, out) of a Llama block's linears after TP (QKV fused, gate+up fused)."""
    return [
        ("qkv", h, (q_out + 2 * kv_out) // tp),
        ("o", q_out // tp, h),
        ("w13", h, 2 * f // tp),
        ("w2", f // tp, h),
    ]


LLAMA_LINEARS = {
    "llama3-8b": _llama_linears(4096, 4096, 1024, 14336, 1),
    "llama3-70b-tp8": _llama_linears(8192, 8192, 1024, 28672, 8),
    "llama3-405b-tp8": _llama_linears(16384, 16384, 1024, 53248, 8),
}


def _roles(tokens: int, din: int, dout: int) -> dict[str, tuple[int, int, int]]:
    """(m, k, n) of a linear's three GEMMs: forward ``T x in @ in x out``, input gradient ``T x out @ out x
    in``, weight gradient ``out x T @ T x in``."""
    return {"fwd": (tokens, din, dout), "dgrad": (tokens, dout, din), "wgrad": (dout, tokens, din)}


def _fp8_scales(m: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_scaled_mm`` scales: one per tensor, and per row of ``a`` / column of ``b`` (rowwise)."""
    return torch.ones((), device=DEV), torch.ones(m, 1, device=DEV), torch.ones(1, n, device=DEV)


def fp8_gemms() -> list[dict[str, object]]:
    """bf16 ``mm`` vs ``torch._scaled_mm`` (e4m3 x e4m3 -> bf16, fast accumulation as torchao's forward)
    with one scale per tensor (tensorwise) and per row / column (rowwise), for the three GEMMs of each
    linear: forward ``T x in @ in x out``, input gradient ``T x out @ out x in``, weight gradient
    ``out x T @ T x in``. The casts are not included (the model prices them at HBM bandwidth)."""
    if not CUDA:
        return []
    fp8 = torch.float8_e4m3fn
    rows: list[dict[str, object]] = []
    tokens = 8192
    for model, linears in LLAMA_LINEARS.items():
        for name, din, dout in linears:
            for role, (m, k, n) in _roles(tokens, din, dout).items():
                a = torch.randn(m, k, device=DEV, dtype=DT)
                b = torch.randn(n, k, device=DEV, dtype=DT).t()  # column-major, as _scaled_mm wants
                t_bf16 = timed(lambda: a @ b)
                a8, b8 = a.to(fp8), b.to(fp8)
                one, sa, sb = _fp8_scales(m, n)
                t_tw = timed(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=DT, use_fast_accum=True))
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
    for model in ("llama3-8b", "llama3-70b-tp8"):
        for name, din, dout in LLAMA_LINEARS[model]:
            for role, (m, k, n) in _roles(tokens, din, dout).items():
                if role == "fwd":  # the backward GEMMs only (module docstring)
                    continue
                a8 = torch.randn(m, k, device=DEV, dtype=DT).to(fp8)
                b8 = torch.randn(n, k, device=DEV, dtype=DT).to(fp8).t()
                one, sa, sb = _fp8_scales(m, n)
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
