"""The training script DeepSpeed Autotuning launches in ``benchmarks/ds_autotuning.py`` (the trial workload:
autotune's own model and synthetic batches, so both tuners time the same computation).

``deepspeed --autotuning run --num_gpus 2 benchmarks/_ds_autotune_train.py --deepspeed_config ds.json``; the
autotuner rewrites ``--deepspeed_config`` per experiment, and the engine exits by itself after its profile
steps (``autotuning.end_profile_step``), writing the throughput it measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import deepspeed
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.catalog import load_model  # noqa: E402
from autotune.trials.model import build_model, synthetic_batch  # noqa: E402
from autotune.trials.train import lm_loss, make_optimizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # skip a 30 s JIT build (PLATFORM.md)
    deepspeed.init_distributed(dist_backend="gloo")
    spec = load_model(args.model)
    model = build_model(spec, device="cpu", seed=0)
    optimizer = make_optimizer(model.parameters(), lr=1e-3, fused=False)  # as the CPU trials run it
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=args.deepspeed_config)
    mbs, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rank = torch.distributed.get_rank()
    for step in range(args.steps):
        for micro in range(gas):
            x, y = synthetic_batch(
                spec,
                batch=mbs * torch.distributed.get_world_size(),
                seq_len=args.seq_len,
                step=step * gas + micro,
                seed=0,
                rows=slice(rank * mbs, (rank + 1) * mbs),
            )
            engine.backward(lm_loss(engine(x), y))
            engine.step()


if __name__ == "__main__":
    main()
