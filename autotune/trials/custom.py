"""Trials of the user's own model (``--workload pkg.module:build``; protocol in ``autotune.workload``).

``build_workload`` imports the builder in the worker and calls it; ``WorkloadTrainer`` applies the plan
with the same steps as the built-in model (``apply_tp`` by the user's ``tp_plan`` -> ``apply_ac`` per block
-> ``apply_dp`` per block then the root) and trains on the user's batches. ``workload_module`` prepares the
model for ``deepspeed.initialize`` (recompute applied; DeepSpeed shards it).

Only torch is imported: this module runs where optuna and deepspeed are not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from autotune.errors import TrialError
from autotune.plan import ParallelPlan, Recompute
from autotune.trials.config import TrialConfig
from autotune.trials.parallelize import apply_ac, apply_dp, wraps_data_parallel
from autotune.trials.train import NativeTrainer, lm_loss
from autotune.workload import TP_STYLES, Workload, load_builder

__all__ = ["build_workload", "block_slots", "apply_tp_plan", "workload_module", "WorkloadTrainer"]


def build_workload(config: TrialConfig, plan: ParallelPlan, device: torch.device) -> Workload:
    """Import ``config.workload`` and call it with the global RNG seeded alike on every rank."""
    assert config.workload is not None
    if config.workload_root and config.workload_root not in sys.path:
        sys.path.insert(0, config.workload_root)
    builder = load_builder(config.workload)
    torch.manual_seed(config.seed)
    workload = builder(config.model, plan, device)
    if not isinstance(workload, Workload):
        raise TrialError(
            f"--workload {config.workload}: returned {type(workload).__name__}, "
            "not autotune.workload.Workload"
        )
    return workload


def _check(workload: Workload, plan: ParallelPlan, target: str | None) -> None:
    """What this workload cannot run, as one line; checked before anything is wrapped."""
    if plan.pp > 1 or plan.cp > 1:
        raise TrialError(
            f"--workload {target}: pipeline and context parallelism are not applied to your "
            "model; pin --pp 1 --cp 1"
        )
    if plan.ep > 1 or plan.etp > 1:
        raise TrialError(f"--workload {target}: expert parallelism is not applied to your model; pin --ep 1")
    if plan.tp > 1 and not workload.tp_plan:
        raise TrialError(
            f"--workload {target}: TP={plan.tp} needs Workload.tp_plan (block submodule -> "
            "colwise|rowwise); pin --tp 1 to search without TP"
        )
    bad = {k: v for k, v in workload.tp_plan.items() if v not in TP_STYLES}
    if bad:
        raise TrialError(f"--workload {target}: tp_plan styles must be {' or '.join(TP_STYLES)}: {bad}")
    if plan.recompute is Recompute.SELECTIVE and not workload.selective:
        raise TrialError(
            f"--workload {target}: selective recompute needs Workload.selective (block "
            "submodules to checkpoint); pin --recompute none or full"
        )


def block_slots(model: nn.Module, block: type | tuple[type, ...] | None) -> list[tuple[nn.Module, str]]:
    """``(parent, name)`` of every outermost module of class ``block`` (none when ``block`` is None)."""
    if block is None:
        return []
    slots: list[tuple[nn.Module, str]] = []
    found: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, block) and not any(name.startswith(f"{f}.") for f in found) and name:
            parent_name, _, leaf = name.rpartition(".")
            slots.append((model.get_submodule(parent_name), leaf))
            found.append(name)
    return slots


def apply_tp_plan(blocks: list[nn.Module], tp_mesh: DeviceMesh, tp_plan: dict[str, str]) -> None:
    """Megatron TP inside each block: ``colwise`` shards a linear's output features, ``rowwise`` its input
    features and all-reduces its output. Outside the blocks, parameters stay replicated over TP."""
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in blocks:
        parallelize_module(block, tp_mesh, {name: styles[s]() for name, s in tp_plan.items()})


def _prepare(
    workload: Workload, plan: ParallelPlan, target: str | None, mesh: DeviceMesh | None
) -> list[tuple[nn.Module, str]]:
    """TP, then activation checkpointing (the order and its reason as in ``parallelize``)."""
    _check(workload, plan, target)
    slots = block_slots(workload.model, workload.block)
    if plan.tp > 1:
        if mesh is None:
            raise TrialError(
                f"--workload {target}: DeepSpeed AutoTP is not applied to your model; pin --tp 1"
            )
        apply_tp_plan([getattr(p, n) for p, n in slots], mesh["tp"], dict(workload.tp_plan))
    if plan.recompute is not Recompute.NONE:
        if not slots and plan.recompute is Recompute.FULL:
            raise TrialError(f"--workload {target}: full recompute needs Workload.block (the block class)")
        apply_ac(workload.model, plan.recompute, slots=slots, selective=workload.selective)
    return slots


def workload_module(workload: Workload, plan: ParallelPlan, target: str | None) -> nn.Module:
    """The user's model ready for ``deepspeed.initialize`` (recompute applied; no TP, no pipeline)."""
    _prepare(workload, plan, target, mesh=None)
    return workload.model


class WorkloadTrainer(NativeTrainer):
    """``NativeTrainer`` on the user's model and batches (``step(i) -> (loss, weight)`` as there)."""

    def _build(self) -> list[nn.Module]:
        cfg, plan = self.config, self.plan
        self.workload = build_workload(cfg, plan, self.device)
        model = self.workload.model
        slots = _prepare(self.workload, plan, cfg.workload, self.mesh)
        if wraps_data_parallel(plan, fsdp_at_dp1=cfg.fsdp_at_dp1):
            from torch.distributed.fsdp import MixedPrecisionPolicy

            param_dtype = self.dtype if self.dtype != torch.float32 else None
            mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
            apply_dp(
                model,
                self.mesh,
                plan=plan,
                mp_policy=mp,
                fsdp_at_dp1=cfg.fsdp_at_dp1,
                blocks=[getattr(p, n) for p, n in slots],
            )  # re-read: AC may have wrapped them
        self.schedule = None
        self.loss_fn: Callable[..., torch.Tensor] = self.workload.loss or lm_loss
        return [model]

    def step(self, step: int) -> tuple[torch.Tensor, float]:
        plan, (model,) = self.plan, self.modules
        n = plan.num_microbatches
        total = torch.zeros((), device=self.device)
        with self._cast():
            for i in range(n):
                inputs, labels = self.workload.batch(
                    step * n + i, plan.micro_batch, plan.seq_len, self.device
                )
                loss = self.loss_fn(model(inputs), labels)
                (loss / n).backward()
                total += loss.detach()
                if self.microbatch_hook is not None:
                    self.microbatch_hook()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total / n, 1.0
