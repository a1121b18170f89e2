"""Device probe for the step-time model: GEMM, attention, whole-block and LM-head times on one GPU (bf16).

Run on a GPU machine: `python benchmarks/gpu_block.py OUT_DIR`; writes OUT_DIR/probe.json.
The H200 result behind gemm_efficiency and the FlashAttention backward slowdown:
benchmarks/results/gpu_block_h200.json."""

import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
from benchmarks._gpu_timing import timed as _timed  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = DEV == "cpu"
DT = torch.bfloat16
timed = functools.partial(_timed, warmup=3, iters=10)


def gemm(m, n, k):
    a = torch.randn(m, k, device=DEV, dtype=DT)
    b = torch.randn(k, n, device=DEV, dtype=DT)
    s = timed(lambda: a @ b)
    return {"m": m, "n": n, "k": k, "s": s, "tflops": 2 * m * n * k / s / 1e12}


class Block(torch.nn.Module):
    """Llama block: RMSNorm (fused F.rms_norm), GQA attention via SDPA causal, SwiGLU; no RoPE."""

    def __init__(self, h, heads, kv, f):
        super().__init__()
        hd = 128
        self.heads, self.kvh, self.hd = heads, kv, hd
        self.q = torch.nn.Linear(h, heads * hd, bias=False)
        self.k = torch.nn.Linear(h, kv * hd, bias=False)
        self.v = torch.nn.Linear(h, kv * hd, bias=False)
        self.o = torch.nn.Linear(heads * hd, h, bias=False)
        self.w1 = torch.nn.Linear(h, f, bias=False)
        self.w3 = torch.nn.Linear(h, f, bias=False)
        self.w2 = torch.nn.Linear(f, h, bias=False)
        self.n1 = torch.nn.Parameter(torch.ones(h))
        self.n2 = torch.nn.Parameter(torch.ones(h))

    def forward(self, x):
        b, s, h = x.shape
        y = F.rms_norm(x, (h,), self.n1)
        q = self.q(y).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k(y).view(b, s, self.kvh, self.hd).transpose(1, 2)
        v = self.v(y).view(b, s, self.kvh, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kvh != self.heads)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        y = F.rms_norm(x, (h,), self.n2)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def block(name, h, heads, kv, f, b, s):
    m = Block(h, heads, kv, f).to(DEV, DT)
    x = torch.randn(b, s, h, device=DEV, dtype=DT, requires_grad=True)
    fwd = timed(lambda: m(x))

    def fb():
        m(x).sum().backward()

    fwdbwd = timed(fb)
    with torch.no_grad():
        pass
    return {
        "name": name,
        "h": h,
        "heads": heads,
        "kv": kv,
        "f": f,
        "b": b,
        "s": s,
        "fwd_s": fwd,
        "fwd_bwd_s": fwdbwd,
    }


def attention(heads, kv, b, s):
    q = torch.randn(b, heads, s, 128, device=DEV, dtype=DT, requires_grad=True)
    k = torch.randn(b, kv, s, 128, device=DEV, dtype=DT, requires_grad=True)
    v = torch.randn(b, kv, s, 128, device=DEV, dtype=DT, requires_grad=True)

    def g():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != heads)

    fwd = timed(g)
    fb = timed(lambda: g().sum().backward())
    flops_fwd = 4 * b * s * s * heads * 128 * 0.5
    return {
        "heads": heads,
        "kv": kv,
        "b": b,
        "s": s,
        "fwd_s": fwd,
        "fwd_bwd_s": fb,
        "fwd_tflops_causal_half": flops_fwd / fwd / 1e12,
        "fwd_bwd_tflops_causal_half": 3 * flops_fwd / fb / 1e12,
    }


def lm_head(h, vocab, tokens):
    w = torch.randn(vocab, h, device=DEV, dtype=DT, requires_grad=True)
    x = torch.randn(tokens, h, device=DEV, dtype=DT, requires_grad=True)
    t = torch.randint(0, vocab, (tokens,), device=DEV)
    fb = timed(lambda: F.cross_entropy((x @ w.t()).float(), t).backward())
    return {
        "h": h,
        "vocab": vocab,
        "tokens": tokens,
        "fwd_bwd_s": fb,
        "gemm_tflops": 6 * tokens * h * vocab / fb / 1e12,
    }


def copy_bw():
    n = (1 << 30) if not SMALL else (1 << 20)
    a = torch.empty(n, device=DEV, dtype=DT)
    b = torch.empty_like(a)
    s = timed(lambda: b.copy_(a))
    return {"bytes_moved": 4 * n, "s": s, "gb_s": 4 * n / s / 1e9}


def main():
    out = os.environ.get("OUT", "/tmp")
    sc = 16 if SMALL else 1
    res = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__}
    res["copy"] = copy_bw()
    T = 8192 // sc
    shapes = {"8b": (4096, 1024, 14336), "70b_tp8": (8192, 128, 3584), "70b_tp1": (8192, 1024, 28672)}
    res["gemm"] = {}
    for key, (h, kv, f) in shapes.items():
        if key.startswith("70b_tp8"):
            lst = [(T, 1024 + 2 * kv, h), (T, h, 1024), (T, 2 * f, h), (T, h, f)]
        else:
            lst = [(T, h + 2 * kv, h), (T, h, h), (T, 2 * f, h), (T, h, f)]
        rows = [
            gemm(m, n // (1 if not SMALL else 16) or 1, k // (1 if not SMALL else 16) or 1) for m, n, k in lst
        ]
        tot_f = sum(2 * r["m"] * r["n"] * r["k"] for r in rows)
        tot_s = sum(r["s"] for r in rows)
        res["gemm"][key] = {"rows": rows, "tflops": tot_f / tot_s / 1e12}
        print(key, round(tot_f / tot_s / 1e12, 1), flush=True)
    res["square8192"] = gemm(8192 // sc, 8192 // sc, 8192 // sc)
    res["attention"] = [
        attention(32, 8, 2, 4096 // sc),
        attention(32, 8, 1, 8192 // sc),
        attention(64, 8, 1, 4096 // sc),
    ]
    res["block"] = [
        block("llama3-8b", 4096 // sc, 32 // sc or 1, 8 // sc or 1, 14336 // sc, 2, 4096 // sc),
        block("llama3-8b-s8k", 4096 // sc, 32 // sc or 1, 8 // sc or 1, 14336 // sc, 1, 8192 // sc),
        block("llama2-70b-tp8slice", 8192 // sc, 8 // sc or 1, 1, 3584 // sc, 2, 4096 // sc),
        block("llama2-13b", 5120 // sc, 40 // sc or 1, 40 // sc or 1, 13824 // sc, 2, 4096 // sc),
    ]
    res["lm_head"] = lm_head(4096 // sc, 128256 // sc, 8192 // sc)
    json.dump(res, open(os.path.join(out, "probe.json"), "w"), indent=1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("gemm",)}, indent=1))


if __name__ == "__main__":
    main()
