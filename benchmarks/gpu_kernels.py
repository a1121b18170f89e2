"""Device probe for step-time terms the catalog priced from others' figures (issues 22 and 23): torch's
context-parallel ring as torchtitan runs it, float8 GEMMs (tensorwise and rowwise ``torch._scaled_mm``),
grouped expert GEMMs (``torch._grouped_mm``), SDPA attention rates to 32k keys, FlexAttention at MLA's head
widths (``flex_mla``: torchtitan's DeepSeek-V3 kernel, no catalog curve yet), and the narrow / short-``k``
GEMMs below the shape curve's first point.

The GEMM sections live in ``benchmarks/gpu_gemm_probes.py``, the device and timing in
``benchmarks/_gpu_timing.py``; this script runs them all. Run on one GPU: ``python benchmarks/gpu_kernels.py
OUT_DIR [--only=ring,sdpa,...]`` writes OUT_DIR/gpu_kernels.json after every section (a section that fails
records its error and the rest still run). Without CUDA it runs tiny shapes on the CPU to check the code
paths (``--dry-run`` forces that). Timing: CUDA events, median of the timed repeats after warm-up. H200
results: benchmarks/results/gpu_kernels_*h200.json (benchmarks/gpu_kernels_report.py).

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
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: put the repository root on the path for ``benchmarks.*``
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._gpu_timing import CUDA, DEV, DT, SCALE, timed  # noqa: E402
from benchmarks.gpu_gemm_probes import (  # noqa: E402
    fp8_accum,
    fp8_gemms,
    gemm_shapes,
    grouped_gemms,
    te_style_experts,
    tp_block_linears,
)

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


def flex_rates(
    lengths: tuple[int, ...] = (4096, 8192), dims: tuple[tuple[int, int], ...] = ((192, 128), (128, 128))
) -> list[dict[str, object]]:
    """FlexAttention as torchtitan runs it (torchtitan/models/attention.py at b84d5c0d7, its DeepSeek-V3 rows'
    commit: ``torch.compile(flex_attention, mode="max-autotune-no-cudagraphs")`` with a block mask) on a
    causal mask, ~32k tokens per call, 16 heads of (q/k, v) widths ``dims``: MLA's 192 / 128 (DeepSeek-V3)
    and 128 / 128 beside it, to set a ``flex`` curve next to ``fa2`` / ``cudnn`` / ``efficient``. FLOPs as
    ``sdpa_rates`` counts them. The CPU dry run is eager and forward only (flex has no CPU backward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, mode="max-autotune-no-cudagraphs") if CUDA else flex_attention
    rows: list[dict[str, object]] = []
    heads = 16
    for hd, hv in dims:
        for s in lengths:
            s //= SCALE
            b = max(1, 32768 // SCALE // s)
            mask = create_block_mask(lambda _b, _h, qi, ki: qi >= ki, None, None, s, s, device=DEV)
            q, k, _ = _qkv(heads, s, s, hd, b)
            v = torch.randn(b, heads, s, hv, device=DEV, dtype=DT)
            g = torch.randn(b, heads, s, hv, device=DEV, dtype=DT)
            if CUDA:
                q, k, v = (t.requires_grad_() for t in (q, k, v))
            work = 2.0 * b * heads * s * s * (hd + hv) * 0.5
            row: dict[str, object] = {"kernel": "flex", "hd": hd, "hd_v": hv, "heads": heads, "b": b, "s": s}
            try:
                fwd = timed(lambda: flex(q, k, v, block_mask=mask))
                row.update(fwd_s=fwd, fwd_tflops=work / fwd / 1e12)
                if CUDA:
                    fb = timed(lambda: flex(q, k, v, block_mask=mask).backward(g))
                    row.update(fwd_bwd_s=fb, bwd_tflops_2x=2 * work / max(fb - fwd, 1e-9) / 1e12)
            except Exception as e:  # a shape the kernel refuses is a finding, not a failed section
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print("flex", hd, hv, s, flush=True)
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
        ("flex_mla", flex_rates),
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
