"""Loss parity of the expert-parallel trial layouts with one process, measured as real CPU trials.

Each layout of ``tiny-moe`` (8 experts of 96, top-2, a shared expert, layer 0 dense) runs as a real trial
on gloo (``TorchrunBackend``; ``DeepSpeedBackend`` for the DeepSpeed one, without EP; seed 1234, lr 1e-2,
1 warm-up + 2 measured steps, global batch 4 on 2 ranks and 8 on 4, sequence 32), and its per-step losses
are compared with one process that trains the same weights on the same batches with AdamW and no
torch.distributed. The tests (tests/trials/test_moe_trials.py) assert 1e-4 relative; this records the
differences themselves.

Usage:  python benchmarks/moe_parity.py [--layouts ep2 ep2xdp2 ...]
Writes: benchmarks/results/moe_parity.json and moe_parity.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from autotune.backends.deepspeed import DeepSpeedBackend  # noqa: E402
from autotune.backends.torchrun import TorchrunBackend  # noqa: E402
from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.plan import Framework, ParallelPlan  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402
from autotune.trials.model import build_model, synthetic_batch  # noqa: E402
from autotune.trials.request import TrialRequest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SEED, LR, SEQ, WARMUP, MEASURE = 1234, 1e-2, 32, 1, 2
LAYOUTS: dict[str, dict[str, object]] = {
    "ep2": {"dp": 2, "ep": 2, "sharding": "fsdp-full"},
    "ep2xdp2": {"dp": 4, "ep": 2, "sharding": "fsdp-full"},
    "ep4": {"dp": 4, "ep": 4, "sharding": "fsdp-grad-op"},
    "ep2xhsdp2x2+full-ac": {"dp": 4, "ep": 2, "sharding": "hsdp", "hsdp_shard_size": 2, "recompute": "full"},
    "pp2xep2": {"pp": 2, "dp": 2, "ep": 2, "sharding": "fsdp-full"},
    "ds-zero3": {"dp": 2, "sharding": "zero3", "framework": "deepspeed"},
}


def reference(model: ModelSpec, global_batch: int) -> list[float]:
    net = build_model(model, device="cpu", seed=SEED)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(WARMUP + MEASURE):
        x, y = synthetic_batch(model, batch=global_batch, seq_len=SEQ, step=step, seed=SEED)
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def run(name: str, model: ModelSpec, root: Path) -> dict[str, object]:
    plan = ParallelPlan(global_batch=4, seq_len=SEQ, **LAYOUTS[name])
    if plan.world_size == 4:
        plan = plan.replace(global_batch=8)
    request = TrialRequest(
        model=model,
        cluster=make_cluster(num_gpus=plan.world_size, gpu="cpu"),
        plan=plan,
        trial_dir=root / name,
        timeout_s=300,
        warmup_steps=WARMUP,
        measure_steps=MEASURE,
    )
    backend_cls = DeepSpeedBackend if plan.framework is Framework.DEEPSPEED else TorchrunBackend
    result = backend_cls(device="cpu", seed=SEED, lr=LR).run(request)
    if result.error:
        return {"layout": name, "plan": LAYOUTS[name], "error": result.error}
    got, want = result.extra["losses"], reference(model, plan.global_batch)
    diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
    rel = max(d / abs(w) for d, w in zip(diffs, want, strict=True))
    return {
        "layout": name,
        "plan": LAYOUTS[name],
        "ranks": plan.world_size,
        "losses": got,
        "reference": want,
        "max_abs_diff": max(diffs),
        "max_rel_diff": rel,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    args = parser.parse_args()
    model = load_model("tiny-moe")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.layouts:
            start = time.time()
            rows.append(run(name, model, Path(tmp)))
            took = time.time() - start
            print(f"{name}: {rows[-1].get('max_abs_diff', rows[-1].get('error'))} ({took:.0f} s)", flush=True)
    out = {
        "model": "tiny-moe",
        "seed": SEED,
        "lr": LR,
        "seq_len": SEQ,
        "steps": WARMUP + MEASURE,
        "torch": torch.__version__,
        "rows": rows,
    }
    (RESULTS / "moe_parity.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        "# MoE trial loss parity (benchmarks/moe_parity.py)",
        "",
        f"tiny-moe, real torchrun CPU trials on gloo, {WARMUP + MEASURE} AdamW steps, torch "
        f"{torch.__version__}: per-step loss against one process with the same weights and batches.",
        "",
        "| layout | ranks | plan | max abs loss diff | max rel diff |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layout']} | | {r['plan']} | error: {r['error']} | |")
        else:
            lines.append(
                f"| {r['layout']} | {r['ranks']} | {r['plan']} | {r['max_abs_diff']:.2e} | "
                f"{r['max_rel_diff']:.2e} |"
            )
    (RESULTS / "moe_parity.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
