"""One training step of the trial workload under the PyTorch-native stack (FSDP2, DTensor TP, pipelining).

``NativeTrainer(plan=..., config=..., device=...)`` builds the model, the mesh, the parallel layout
and AdamW; ``step(i)`` runs one optimizer step over the global batch of step ``i`` and returns this
rank's ``(loss, weight)`` (weight 0 on pipeline stages without the loss) so that the caller can
average the loss over the ranks that hold it. The loss stays a device tensor: reading it would
synchronise the GPU in the middle of the step.

Only torch is imported: this module runs where optuna and deepspeed are not installed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate

from autotune.errors import TrialError
from autotune.plan import LossKernel, ParallelPlan, Precision, StoreDtype
from autotune.trials.config import TrialConfig
from autotune.trials.model import build_model, init_weights, synthetic_batch
from autotune.trials.parallelize import (
    build_expert_mesh,
    build_mesh,
    build_schedule,
    dp_degrees,
    parallelize,
    split_stages,
    wraps_data_parallel,
)

__all__ = [
    "NativeTrainer",
    "compute_dtype",
    "check_stored_dtypes",
    "dp_rows",
    "lm_loss",
    "make_optimizer",
    "reduce_partial_grads",
]


def _no_outputs(schedule) -> dict[str, bool]:
    """``step(return_outputs=False)`` where torch has it (2.10+, torch/distributed/pipelining/schedules.py):
    the last stage then keeps no micro-batch outputs for a merge nobody reads, as torchtitan runs it
    (e5ef99aab) and as the memory model prices it (costmodel/pipebuffers.py); older torch keeps them until
    the next step."""
    known = inspect.signature(schedule.step).parameters
    return {"return_outputs": False} if "return_outputs" in known else {}


def compute_dtype(plan: ParallelPlan, device: torch.device) -> torch.dtype:
    """bf16/fp16 compute on a GPU; fp32 on the CPU (gloo trials check correctness, not speed)."""
    if device.type != "cuda":
        return torch.float32
    if plan.precision is Precision.FP8:
        raise NotImplementedError("fp8 training is not implemented in real trials; use bf16")
    return torch.float16 if plan.precision is Precision.FP16 else torch.bfloat16


def check_stored_dtypes(plan: ParallelPlan, device: torch.device, *, workload: bool) -> None:
    """The plan's bf16 stores (``weight_dtype``, ``adam_dtype``, ``loss_kernel``) run in the built-in model on
    a GPU; a CPU trial computes in fp32 and a user's workload owns its dtypes, so both are refused, as is
    fp32 moments beside bf16 weights (``torch.optim.AdamW`` allocates its moments like the parameter)."""
    if not plan.numerics_flags:
        return
    if plan.loss_kernel in (LossKernel.FUSED, LossKernel.CHUNKED):
        raise TrialError(f"--loss-kernel {plan.loss_kernel}: the trial model runs torch's cross-entropy")
    if device.type != "cuda" or workload:
        where = "your --workload sets its own dtypes" if workload else "CPU trials train in fp32"
        raise TrialError(f"{' '.join(plan.numerics_flags)} run on a GPU trial: {where}")
    if plan.weight_dtype is StoreDtype.BF16 and plan.moment_dtype is StoreDtype.FP32:
        raise TrialError("--adam-dtype fp32 beside bf16 weights: trial AdamW keeps moments like the weights")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, upcast: bool = True) -> torch.Tensor:
    """Mean next-token cross-entropy, in fp32 unless ``upcast`` is off (``plan.loss_kernel`` bf16)."""
    return F.cross_entropy((logits.float() if upcast else logits).flatten(0, 1), targets.flatten())


def dp_rows(plan: ParallelPlan, dp_rank: int) -> slice:
    """This DP rank's sequences of the global batch."""
    per_rank = plan.global_batch // plan.dp
    return slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)


def make_optimizer(params, *, lr: float, fused: bool) -> torch.optim.AdamW:
    """AdamW(0.9, 0.95, wd 0.1) as production trainers run it on GPUs: the fused kernel (no foreach
    temporaries the size of the parameters, few launches); foreach on the CPU."""
    impl = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, **impl)


def _param_groups(modules: list[nn.Module]) -> list[dict[str, list[nn.Parameter]]]:
    """DTensor and plain parameters in separate groups: a foreach kernel cannot mix them (TP without
    SP leaves the norms plain)."""
    params = [p for m in modules for p in m.parameters()]
    dtensor = [p for p in params if isinstance(p, DTensor)]
    plain = [p for p in params if not isinstance(p, DTensor)]
    return [{"params": g} for g in (dtensor, plain) if g]


def reduce_partial_grads(params: Iterable[nn.Parameter]) -> int:
    """Reduce every gradient left ``Partial`` on a mesh dimension, once per step and coalesced; returns the
    collectives issued.

    Under sequence parallelism each TP rank normalises its sequence shard only, so the norms' weight
    gradients are partial sums over the TP group (``Partial(sum)`` DTensors under torch's
    ``SequenceParallel``). Left so, every AdamW ``foreach`` operator that reads them redistributes them
    again: 3 all-reduces per norm weight per step (27 on ``tiny``, 51 on ``small`` at TP 2, counted with
    ``CommDebugMode``), 27 ms and 44 ms of a 2-rank gloo step. Megatron-LM reduces them once, coalesced, in
    ``finalize_model_grads`` (``_allreduce_layernorm_grads``); so does this: one all-reduce per group of
    gradients with the same mesh and placements (one group in autotune's layouts), on the mesh dimension
    that is partial, and the gradients come back ``Replicate`` there."""
    groups: dict[tuple, list[nn.Parameter]] = defaultdict(list)
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            groups[g.device_mesh, tuple(g.placements)].append(p)
    calls = 0
    for (mesh, placements), members in groups.items():
        local = [p.grad.to_local() for p in members]
        flat = torch.cat([t.reshape(-1) for t in local])
        for dim, pl in enumerate(placements):
            if isinstance(pl, Partial):
                op = dist.ReduceOp.AVG if pl.reduce_op == "avg" else dist.ReduceOp.SUM
                dist.all_reduce(flat, op=op, group=mesh.get_group(dim))
                calls += 1
        done = tuple(Replicate() if pl.is_partial() else pl for pl in placements)
        for p, t, piece in zip(members, local, flat.split([t.numel() for t in local]), strict=True):
            p.grad = DTensor.from_local(
                piece.view_as(t), mesh, done, run_check=False, shape=p.grad.shape, stride=p.grad.stride()
            )
    return calls


class NativeTrainer:
    def __init__(self, *, plan: ParallelPlan, config: TrialConfig, device: torch.device) -> None:
        self.plan, self.config, self.device = plan, config, device
        self.dtype = compute_dtype(plan, device)
        check_stored_dtypes(plan, device, workload=bool(config.workload))
        self.loss_fn: Callable[..., torch.Tensor] = functools.partial(
            lm_loss, upcast=plan.loss_kernel is LossKernel.FP32
        )
        self.mesh = build_mesh(plan, device.type)
        self.expert_mesh = build_expert_mesh(plan, device.type)
        _, shard = dp_degrees(plan)
        self.dp_rank = self.mesh.get_local_rank("dp_replicate") * shard + self.mesh.get_local_rank("dp_shard")
        self.modules = self._build()
        groups = _param_groups(self.modules)
        self.optimizer = make_optimizer(groups, lr=config.lr, fused=device.type == "cuda")
        self.microbatch_hook: Callable[[], None] | None = None
        """Called after each micro-batch's backward (the worker's memory tracker resets per-module stats)."""
        # Under FSDP/replicate the mixed-precision policy casts; otherwise autocast does.
        wrapped = wraps_data_parallel(plan, fsdp_at_dp1=config.fsdp_at_dp1)
        self._autocast = self.dtype != torch.float32 and not wrapped

    def _build(self) -> list[nn.Module]:
        cfg, plan = self.config, self.plan
        model = build_model(cfg.model, device=self.device, seed=cfg.seed if cfg.full_init else None)
        if plan.weight_dtype is StoreDtype.BF16:  # no fp32 master: FSDP2 shards and steps bf16 parameters
            model = model.to(torch.bfloat16)
        param_dtype = self.dtype if self.dtype != torch.float32 else None
        kwargs = {
            "plan": plan,
            "mesh": self.mesh,
            "param_dtype": param_dtype,
            "fsdp_at_dp1": cfg.fsdp_at_dp1,
            "expert_mesh": self.expert_mesh,
        }
        if plan.pp == 1:
            chunks = [(0, model)]
        else:
            chunks = split_stages(model, plan=plan, pp_rank=self.mesh.get_local_rank("pp"))
        modules = [parallelize(m, **kwargs) for _, m in chunks]
        if not cfg.full_init:  # sharded on meta: allocate only this rank's shards, then fill them
            for m in modules:
                m.to_empty(device=self.device)
                init_weights(m, seed=cfg.seed)
        self.schedule = None
        if plan.pp > 1:
            self.schedule = build_schedule(
                list(zip([s for s, _ in chunks], modules, strict=True)),
                plan=plan,
                mesh=self.mesh,
                device=self.device,
                loss_fn=self.loss_fn,
            )
            self._stage_ids = [s for s, _ in chunks]
        return modules

    @property
    def memory_trackable(self) -> bool:
        """MemTracker follows a module called once per micro-batch, not a pipeline schedule."""
        return self.schedule is None

    def _cast(self) -> contextlib.AbstractContextManager:
        if not self._autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self, step: int) -> tuple[torch.Tensor, float]:
        plan = self.plan
        inputs, targets = synthetic_batch(
            self.config.model,
            batch=plan.global_batch,
            seq_len=plan.seq_len,
            step=step,
            seed=self.config.seed,
            rows=dp_rows(plan, self.dp_rank),
            device=self.device,
        )
        run = self._pipeline_step if self.schedule is not None else self._step
        with self._cast():
            loss, weight = run(inputs, targets)
        reduce_partial_grads(p for m in self.modules for p in m.parameters())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, weight

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Gradient accumulation over micro-batches; the loss is scaled so gradients are the batch mean."""
        (model,) = self.modules
        n = self.plan.num_microbatches
        total = torch.zeros((), device=self.device)
        for x, y in zip(inputs.chunk(n), targets.chunk(n), strict=True):
            loss = self.loss_fn(model(x), y)
            (loss / n).backward()
            total += loss.detach()
            if self.microbatch_hook is not None:
                self.microbatch_hook()
        return total / n, 1.0

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, float]:
        assert self.schedule is not None  # run only with a schedule (step)
        num_stages = self.plan.pp * self.plan.virtual_stages
        first, last = 0 in self._stage_ids, num_stages - 1 in self._stage_ids
        losses: list[torch.Tensor] = []
        args = (inputs,) if first else ()
        if last:
            self.schedule.step(*args, target=targets, losses=losses, **_no_outputs(self.schedule))
            return torch.stack(losses).detach().mean(), 1.0
        self.schedule.step(*args, **_no_outputs(self.schedule))
        return torch.zeros((), device=self.device), 0.0
