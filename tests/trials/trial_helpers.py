"""Helpers of the real-trial tests: the tiny model's requests and the single-process reference."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from autotune.catalog import make_cluster
from autotune.plan import ParallelPlan
from autotune.specs import ModelSpec
from autotune.trials.model import build_model, synthetic_batch
from autotune.trials.request import TrialRequest

SEED = 1234
LR = 1e-2
WARMUP, MEASURE = 1, 2
"""Three optimizer steps per trial: enough for the weights of steps 2 and 3 to depend on the update."""


def make_request(
    model: ModelSpec,
    plan: ParallelPlan,
    trial_dir: Path,
    *,
    timeout_s: float = 120.0,
    warmup_steps: int = WARMUP,
    measure_steps: int = MEASURE,
) -> TrialRequest:
    return TrialRequest(
        model=model,
        cluster=make_cluster(num_gpus=plan.world_size, gpu="cpu"),
        plan=plan,
        trial_dir=trial_dir,
        timeout_s=timeout_s,
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
    )


def reference_losses(
    model: ModelSpec, *, global_batch: int, seq_len: int, steps: int, seed: int = SEED, lr: float = LR
) -> list[float]:
    """One process, no torch.distributed, the whole batch at once: the loss before each optimizer step.

    Written independently of the trainers: same weights (``build_model``), same data, same AdamW
    hyper-parameters, nothing else shared.
    """
    net = build_model(model, device="cpu", seed=seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step in range(steps):
        x, y = synthetic_batch(model, batch=global_batch, seq_len=seq_len, step=step, seed=seed)
        loss = F.cross_entropy(net(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
