"""Run under torchrun (2 gloo ranks): count the collectives the trials issue; rank 0 writes them as JSON.

``_count_comm.py tp OUT``: TP collective calls of one micro-batch of the trial model, ``{layout: [forward,
backward]}`` (CommDebugMode). ``_count_comm.py host OUT``: ATen operators of one micro-batch of the
TP trial model, plain and on DTensors, per block and outside the blocks, ``{layout: {"block"|"edge":
[forward plain, forward DTensor, backward plain, backward DTensor]}}``. ``_count_comm.py dp OUT``: DP
collectives of one optimizer step of the trial trainers, ``{layout: {op: calls}}`` (CommDebugMode's module
tracker trips over FSDP2 with micro-batches, so a plain dispatch mode counts the c10d ops).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.specs import ModelSpec
from autotune.trials.config import TrialConfig
from autotune.trials.deepspeed_engine import DeepSpeedTrainer
from autotune.trials.model import build_model
from autotune.trials.parallelize import build_mesh, parallelize
from autotune.trials.train import _param_groups, lm_loss, make_optimizer, reduce_partial_grads
from autotune.trials.worker import make_trainer

TP_LAYOUTS = {"torch": {}, "torch-sp": {"sequence_parallel": True}, "deepspeed": {"framework": "deepspeed"}}
DP_LAYOUTS = {  # name: (framework, sharding, micro-batch, model)
    "fsdp-none-m2": ("fsdp", "none", 1, "tiny"),
    "fsdp-full-m2": ("fsdp", "fsdp-full", 1, "tiny"),
    "deepspeed-zero1-m1": ("deepspeed", "zero1", 2, "tiny"),
    "deepspeed-zero3-m1": ("deepspeed", "zero3", 2, "tiny"),
    "deepspeed-zero3-m2": ("deepspeed", "zero3", 1, "tiny"),
    "deepspeed-zero3-m2-small": ("deepspeed", "zero3", 1, "small"),  # its MLP matrices are fetched
}


class _Collectives(TorchDispatchMode):
    """c10d collectives by op."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if "c10d" in func.namespace:
            self.calls[func.name().split("::")[-1].strip("_").replace("_base", "")] += 1
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    """ATen operators by whether a DTensor takes part (the DTensor's own local operators run below the mode
    and are not seen: one DTensor operator is one dispatch through DTensor's sharding propagation)."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = self.dtensor = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            self.dtensor += 1
        else:
            self.plain += 1
        return func(*args, **(kwargs or {}))


def _calls(mode: CommDebugMode) -> int:
    return sum(mode.get_comm_counts().values())


def tp_counts(spec: ModelSpec) -> dict[str, list[int]]:
    x = torch.randint(0, spec.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    out: dict[str, list[int]] = {}
    for name, extra in TP_LAYOUTS.items():
        plan = ParallelPlan(tp=2, global_batch=2, micro_batch=2, seq_len=64, **extra)
        if name == "deepspeed":
            trainer = DeepSpeedTrainer(
                plan=plan, config=TrialConfig(model=spec, device="cpu"), device=torch.device("cpu")
            )
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
        if name == "torch-sp":  # the partial norm gradients: reduced once, then AdamW issues nothing
            optimizer = make_optimizer(_param_groups([model]), lr=1e-3, fused=False)
            with _Collectives() as reduce:
                reduce_partial_grads(model.parameters())
            with _Collectives() as step:
                optimizer.step()
            out["torch-sp-step"] = {"reduce": dict(reduce.calls), "optimizer": dict(step.calls)}
    return out


def _tp_ops(spec: ModelSpec, sequence_parallel: bool) -> list[int]:
    plan = ParallelPlan(tp=2, global_batch=2, micro_batch=2, seq_len=64, sequence_parallel=sequence_parallel)
    model = build_model(spec, device="cpu", seed=0)
    parallelize(model, plan=plan, mesh=build_mesh(plan, "cpu"))
    x = torch.randint(0, spec.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    lm_loss(model(x), x).backward()  # warm-up: DTensor caches its sharding decisions
    with _Ops() as fwd:
        loss = lm_loss(model(x), x)
    with _Ops() as bwd:
        loss.backward()
    return [fwd.plain, fwd.dtensor, bwd.plain, bwd.dtensor]


def host_counts(spec: ModelSpec) -> dict[str, dict[str, list[int]]]:
    out = {}
    for gated in (True, False):
        for sp in (False, True):
            shape = dataclasses.replace(spec, gated_mlp=gated, bias=not gated)
            one, two = (_tp_ops(dataclasses.replace(shape, num_layers=n), sp) for n in (1, 2))
            block = [b - a for a, b in zip(one, two, strict=True)]
            out[f"{'llama' if gated else 'gpt'}{'-sp' if sp else ''}"] = {
                "block": block,
                "edge": [a - b for a, b in zip(one, block, strict=True)],
            }
    return out


def dp_counts(spec: ModelSpec) -> dict[str, dict[str, int]]:
    out = {}
    for name, (framework, sharding, mbs, model) in DP_LAYOUTS.items():
        plan = ParallelPlan(
            dp=2, global_batch=4, micro_batch=mbs, seq_len=64, sharding=sharding, framework=framework
        )
        config = TrialConfig(model=spec if model == spec.name else load_model(model), device="cpu")
        trainer = make_trainer(plan, config, torch.device("cpu"))
        trainer.step(0)
        with _Collectives() as mode:
            trainer.step(1)
        out[name] = dict(mode.calls)
        if hasattr(trainer, "close"):
            trainer.close()
        del trainer
    return out


def tp_dp_counts(spec: ModelSpec) -> dict[str, dict[str, int]]:
    """4 ranks, TP 2 x DP 2: DeepSpeed under ZeRO-3 (AutoTP keeps the embedding and head whole); FSDP2 with
    sequence parallelism at 2 micro-batches (its partial norm gradients)."""
    out = {}
    for name, extra in (
        ("deepspeed-tp2-zero3-m1", {"micro_batch": 2, "sharding": "zero3", "framework": "deepspeed"}),
        ("fsdp-tp2-sp-m2", {"micro_batch": 1, "sharding": "fsdp-full", "sequence_parallel": True}),
    ):
        plan = ParallelPlan(tp=2, dp=2, global_batch=4, seq_len=64, **extra)
        trainer = make_trainer(plan, TrialConfig(model=spec, device="cpu"), torch.device("cpu"))
        trainer.step(0)
        with _Collectives() as mode:
            trainer.step(1)
        if hasattr(trainer, "close"):
            trainer.close()
        out[name] = dict(mode.calls)
    return out


def main() -> None:
    kind, path = sys.argv[1], sys.argv[2]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("gloo")
    spec = load_model("tiny")
    out: Any = {"tp": tp_counts, "host": host_counts, "dp": dp_counts, "tp-dp": tp_dp_counts}[kind](spec)
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
