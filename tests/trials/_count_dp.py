"""Run under torchrun (2 gloo ranks): count the DP collectives of one optimizer step of the trial trainers,
per layout; rank 0 writes ``{layout: {op: calls}}`` as JSON to argv[1]."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.trials.config import TrialConfig
from autotune.trials.worker import make_trainer

LAYOUTS = {"fsdp-none-m2": ("fsdp", "none", 1), "fsdp-full-m2": ("fsdp", "fsdp-full", 1),
           "deepspeed-zero1-m1": ("deepspeed", "zero1", 2), "deepspeed-zero3-m1": ("deepspeed", "zero3", 2),
           "deepspeed-zero3-m2": ("deepspeed", "zero3", 1)}


class _Collectives(TorchDispatchMode):
    """c10d collectives by op (CommDebugMode's module tracker trips over FSDP2 with micro-batches)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "c10d" in func.namespace:
            self.calls[func.name().split("::")[-1].strip("_").replace("_base", "")] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("gloo")
    spec = load_model("tiny")
    out = {}
    for name, (framework, sharding, mbs) in LAYOUTS.items():
        plan = ParallelPlan(dp=2, global_batch=4, micro_batch=mbs, seq_len=64, sharding=sharding,
                            framework=framework)
        trainer = make_trainer(plan, TrialConfig(model=spec, device="cpu"), torch.device("cpu"))
        trainer.step(0)
        with _Collectives() as mode:
            trainer.step(1)
        out[name] = dict(mode.calls)
        if hasattr(trainer, "close"):
            trainer.close()
        del trainer
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
