"""benchmarks/gpu_kernels.py replays torch's CP ring on one device: its calls, merges and gradient
accumulation must compute what the ring computes, so the timings it records are of the real work."""

import math

import pytest
import torch

from benchmarks import gpu_gemm_probes, gpu_kernels


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_replayed_ring_computes_attention_over_the_keys_it_visits(cp):
    """The last rank's ring: its own keys causally, then ``cp - 1`` times the first half of the arriving
    keys in full. With the local K/V standing in for each arriving one, that is attention over the
    concatenation ``[k, k_half x (cp - 1)]`` with a causal mask on the first block; outputs and the
    gradients of q, k, v (the tied copies summed) must match that reference."""
    torch.manual_seed(0)
    heads, length, dim = 2, 64, 32
    q, k, v = (torch.randn(1, heads, length, dim, dtype=torch.float64) for _ in range(3))
    q, k, v = (t.float() for t in (q, k, v))
    out, lse, saved = gpu_kernels.ring_forward(q, k, v, cp)
    dout = torch.randn_like(out)
    gq, gkv = gpu_kernels.ring_backward(dout, q, k, v, out, lse, cp, saved)

    rq, rk, rv = (t.clone().requires_grad_() for t in (q, k, v))
    half = length // 2
    keys = torch.cat([rk] + [rk[:, :, :half]] * (cp - 1), dim=2)
    values = torch.cat([rv] + [rv[:, :, :half]] * (cp - 1), dim=2)
    mask = torch.ones(length, keys.shape[2], dtype=torch.bool)
    mask[:, :length] = torch.ones(length, length, dtype=torch.bool).tril()
    scores = (rq @ keys.transpose(-1, -2)) / math.sqrt(dim)
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ values
    ref.backward(dout)

    assert torch.allclose(out, ref, atol=1e-4)
    assert torch.allclose(lse, torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1), atol=1e-4)
    assert torch.allclose(gq, rq.grad, atol=1e-4)
    assert torch.allclose(gkv[: k.numel()].view_as(k), rk.grad, atol=1e-4)
    assert torch.allclose(gkv[k.numel() :].view_as(v), rv.grad, atol=1e-4)


def test_the_probe_runs_its_sections_on_the_cpu_and_records_each(tmp_path):
    """The device probe's dry run (tiny shapes on the CPU) writes one JSON entry per section it was asked
    for, with timings and no recorded error, so a GPU session can run it unchanged."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sections = "gemm_shapes,grouped_gemm,tp_block_linears,flex_mla"
    subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "gpu_kernels.py"),
            str(tmp_path),
            "--dry-run",
            f"--only={sections}",
        ],
        check=True,
        cwd=root,
        capture_output=True,
        timeout=300,
    )
    result = json.loads((tmp_path / "gpu_kernels.json").read_text())
    assert result["device"].startswith("cpu")
    for name in sections.split(","):
        rows = result[name]
        assert isinstance(rows, list) and rows, name
        assert all(v > 0 for r in rows for k, v in r.items() if k.endswith("_s")), name
    assert "ring" not in result
    assert {r["block"] for r in result["tp_block_linears"]} == set(gpu_gemm_probes.TP_BLOCKS)
    flex = result["flex_mla"]  # MLA's 192-wide q/k with 128-wide v, timed, not refused
    assert not [r for r in flex if "error" in r]
    assert {(r["hd"], r["hd_v"]) for r in flex} == {(192, 128), (128, 128)}
