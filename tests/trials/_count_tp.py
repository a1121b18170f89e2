"""Run under torchrun (2 gloo ranks): count the TP collectives one micro-batch of the trial model issues,
per layout, with CommDebugMode; rank 0 writes ``{layout: [forward, backward]}`` as JSON to argv[1]."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.trials.config import TrialConfig
from autotune.trials.deepspeed_engine import DeepSpeedTrainer
from autotune.trials.model import build_model
from autotune.trials.parallelize import build_mesh, parallelize
from autotune.trials.train import lm_loss

LAYOUTS = {"torch": {}, "torch-sp": {"sequence_parallel": True}, "deepspeed": {"framework": "deepspeed"}}


def _calls(mode: CommDebugMode) -> int:
    return sum(mode.get_comm_counts().values())


def main() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("gloo")
    spec = load_model("tiny")
    x = torch.randint(0, spec.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    out: dict[str, list[int]] = {}
    for name, extra in LAYOUTS.items():
        plan = ParallelPlan(tp=2, global_batch=2, micro_batch=2, seq_len=64, **extra)
        if name == "deepspeed":
            trainer = DeepSpeedTrainer(plan=plan, config=TrialConfig(model=spec, device="cpu"),
                                       device=torch.device("cpu"))
            forward, backward = trainer.engine, trainer.engine.backward
        else:
            model = build_model(spec, device="cpu", seed=0)
            parallelize(model, plan=plan, mesh=build_mesh(plan, "cpu"))
            forward, backward = model, (lambda loss: loss.backward())
        with CommDebugMode() as fwd:
            loss = lm_loss(forward(x), x)
        with CommDebugMode() as bwd:
            backward(loss)
        out[name] = [_calls(fwd), _calls(bwd)]
        if name == "deepspeed":
            trainer.close()
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
