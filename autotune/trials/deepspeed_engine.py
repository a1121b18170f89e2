"""The trial workload under DeepSpeed: ``deepspeed.initialize`` with the config ``autotune emit`` writes.

The ds_config is ``autotune.emit.deepspeed.to_ds_config(plan)`` (ZeRO 0-3, optimizer offload, AutoTP
``tensor_parallel.autotp_size`` when TP > 1, the pipeline section when PP > 1) with three trial changes:
fp32 on the CPU (no bf16 section), no gradient clipping (the native trainer has none either, so losses
compare), ``zero_force_ds_cpu_optimizer: false`` so that offload keeps the client torch AdamW (no
DeepSpeedCPUAdam JIT build), and AutoTP's ``preset_model: llama`` (the workload uses Llama's layer
names). PP > 1 runs DeepSpeed's ``PipelineModule`` (its own 1F1B schedule). CP > 1 is DeepSpeed-Ulysses:
DeepSpeed's own sequence-parallel groups as the mpu (ZeRO over DP x CP) and ``DistributedAttention``
around each attention core; each rank trains on its slice of every sequence.

deepspeed is imported inside ``DeepSpeedTrainer``: importing this module needs only torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autotune.errors import TrialError
from autotune.plan import ParallelPlan, Recompute
from autotune.trials.config import TrialConfig
from autotune.trials.model import Attention, Block, Transformer, build_model, synthetic_batch
from autotune.trials.parallelize import apply_ac
from autotune.trials.train import dp_rows, lm_loss, make_optimizer

__all__ = ["trial_ds_config", "DeepSpeedTrainer"]


def trial_ds_config(plan: ParallelPlan, *, on_cpu: bool) -> dict[str, Any]:
    from autotune.emit.deepspeed import to_ds_config

    cfg = to_ds_config(plan)
    cfg["gradient_clipping"] = 0.0
    if on_cpu:  # gloo trials check correctness in fp32
        cfg.pop("bf16", None)
        cfg.pop("fp16", None)
    if plan.offload:
        cfg["zero_force_ds_cpu_optimizer"] = False
        cfg["zero_optimization"]["offload_optimizer"]["pin_memory"] = not on_cpu
    if plan.tp > 1:  # the workload's layers carry Hugging Face Llama names (q_proj ... down_proj)
        cfg["tensor_parallel"]["preset_model"] = "llama"
    cfg.pop("activation_checkpointing", None)  # recompute is applied to the module (apply_ac / interval)
    cfg["steps_per_print"] = 10**9
    cfg["wall_clock_breakdown"] = False
    return cfg


def _autotp_mpu(plan: ParallelPlan) -> dict[str, Any]:
    """With AutoTP, DeepSpeed 0.19 takes the batch's DP size from an mpu, else from the world size (TP ranks
    counted) and rejects the emitted ``train_batch_size``; ``deepspeed.utils.groups`` with its TP mesh is the
    mpu DeepSpeed's own tensor-parallel setup builds (``merge_tp_model_init_into_config``), and the one
    ``summary.md`` tells user scripts to pass (tests/trials/test_ds_autotp_batch.py)."""
    if plan.tp == 1:
        return {}
    from deepspeed.utils import groups

    groups._init_tp_mesh_device(tensor_model_parallel_size=plan.tp)
    return {"mpu": groups}


def _ulysses_mpu(plan: ParallelPlan) -> dict[str, Any]:
    """DeepSpeed's sequence-parallel groups (consecutive ranks, the plan's CP-inside-DP order), passed as
    the mpu so that ZeRO shards and reduces over the sequence-data-parallel group and the batch size counts
    DP ranks only (deepspeed/runtime/engine.py ``seq_data_parallel_group``)."""
    if plan.cp == 1:
        return {}
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    parallel_state_sp.initialize_sequence_parallel(plan.cp)
    return {"mpu": parallel_state_sp}


class UlyssesCore(nn.Module):
    """``DistributedAttention`` (DeepSpeed-Ulysses) around an attention core that takes ``[b, s, width]``:
    Q, K and V all-to-all'd from a slice of the sequence with every head to the whole sequence with
    ``heads / cp`` of them, the core run on that (its rotary sees full-sequence positions), the output
    all-to-all'd back."""

    def __init__(self, core: nn.Module, head_dim: int, group: Any) -> None:
        super().__init__()
        from deepspeed.sequence.layer import DistributedAttention

        self.head_dim = head_dim
        self.attention = DistributedAttention(_HeadsCore(core, head_dim), group, scatter_idx=2, gather_idx=1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (-1, self.head_dim)) for t in (q, k, v))
        return self.attention(q, k, v, batch_dim_idx=0).flatten(-2)


class _HeadsCore(nn.Module):
    """The core seen from ``DistributedAttention``: ``[b, s, heads, head_dim]`` in and out."""

    def __init__(self, core: nn.Module, head_dim: int) -> None:
        super().__init__()
        self.core, self.head_dim = core, head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self.core(q.flatten(-2), k.flatten(-2), v.flatten(-2))
        return out.unflatten(-1, (-1, self.head_dim))


def apply_ulysses(model: nn.Module, head_dim: int) -> None:
    """Wrap every attention core (after recompute wrapping: selective recompute then reruns the local core
    only, full recompute the whole block with its all-to-alls, as DeepSpeed's checkpointing would)."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    group = parallel_state_sp.get_sequence_parallel_group()
    for module in list(model.modules()):
        if isinstance(module, Attention):
            module.core = UlyssesCore(module.core, head_dim, group)


class _Embed(nn.Module):
    """First pipeline layer: token (+ position) embeddings of the shared model."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.embed_tokens, self.embed_positions = model.embed_tokens, model.embed_positions

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.embed_tokens is not None  # the Transformer's, as in its embed
        h = self.embed_tokens(tokens)
        if self.embed_positions is not None:
            h = h + self.embed_positions(torch.arange(tokens.shape[1], device=tokens.device))
        return h


class _Head(nn.Module):
    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.norm, self.lm_head = model.norm, model.lm_head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        assert self.norm is not None and self.lm_head is not None  # the Transformer's, as in its forward
        return self.lm_head(self.norm(h))


def _pipeline_module(model: Transformer, plan: ParallelPlan, ds_config: dict[str, Any]) -> nn.Module:
    from deepspeed.pipe import PipelineModule

    if model.spec.tie_embeddings:
        raise NotImplementedError("tied embeddings over DeepSpeed pipeline stages are not implemented")
    pipe_cfg = ds_config["pipeline"]
    layers = [_Embed(model), *model.layers.values(), _Head(model)]
    # Recompute covers the transformer blocks only: DeepSpeed's reentrant checkpoint of the embedding (whose
    # input, the token ids, needs no grad) would return a tensor that needs none, and backward would fail.
    # stages and partition are PipelineModule's, not ds_config's: "uniform" over these items is the split
    # autotune/stagesplit.py prices for DeepSpeed (partition_uniform over embedding, blocks and head)
    return PipelineModule(
        layers=layers,
        num_stages=plan.pp,
        loss_fn=lm_loss,
        partition_method="uniform",
        checkpointable_layers=[Block.__name__],
        activation_checkpoint_interval=pipe_cfg["activation_checkpoint_interval"],
    )


class DeepSpeedTrainer:
    """Same interface as ``NativeTrainer``: ``step(i) -> (loss, weight)``, ``modules``, ``optimizer``."""

    memory_trackable = False

    def __init__(self, *, plan: ParallelPlan, config: TrialConfig, device: torch.device) -> None:
        if plan.ep > 1 or plan.etp > 1:
            raise TrialError(
                "DeepSpeed-MoE expert parallelism is not implemented in real trials; use --ep 1 "
                "or --framework fsdp"
            )
        import deepspeed

        # Skip the 25-33 s JIT build of the shared-memory comm op; gloo/nccl carry the collectives.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        # deepspeed.comm adopts the worker's process group; PipelineModule needs it before initialize.
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        self.plan, self.config, self.device = plan, config, device
        rank, tp, cp = torch.distributed.get_rank(), plan.tp, plan.cp
        self.dp_rank = (rank // (tp * cp)) % plan.dp  # rank grid: pp, dp, cp, tp
        local, cp_rank = plan.seq_len // cp, (rank // tp) % cp
        self.cp_span = slice(cp_rank * local, (cp_rank + 1) * local)  # Ulysses: its slice of a sequence
        if plan.cp > 1 and config.workload:
            raise TrialError(
                "DeepSpeed-Ulysses (CP > 1) runs the built-in workload in real trials; a user workload "
                "wraps its own attention in deepspeed.sequence.layer.DistributedAttention"
            )
        mpu = _autotp_mpu(plan) or _ulysses_mpu(plan)
        ds_config = trial_ds_config(plan, on_cpu=device.type == "cpu")
        module = self._module(ds_config)
        # Offload steps DeepSpeed's CPU partitions with this optimizer: the fused kernel only on the GPU.
        fused = device.type == "cuda" and not plan.offload
        optimizer = make_optimizer(module.parameters(), lr=config.lr, fused=fused)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=ds_config, dist_init_required=False, **mpu
        )
        self.modules = [self.engine.module]

    def _module(self, ds_config: dict[str, Any]) -> nn.Module:
        plan, config = self.plan, self.config
        self.workload = None
        if config.workload:  # the user's model (autotune.workload): recompute per block, no TP/PP
            from autotune.trials.custom import build_workload, workload_module

            self.workload = build_workload(config, plan, self.device)
            return workload_module(self.workload, plan, config.workload)
        model = build_model(config.model, device=self.device, seed=config.seed)
        if plan.pp > 1:
            return _pipeline_module(model, plan, ds_config)
        if plan.recompute is not Recompute.NONE:
            apply_ac(model, plan.recompute)
        if plan.cp > 1:
            apply_ulysses(model, config.model.head_dim)
            model.position_offset = self.cp_span.start
        return model

    def _micro_batches(self, step: int) -> list[tuple[Any, torch.Tensor]]:
        plan, n = self.plan, self.plan.num_microbatches
        if self.workload is not None:
            batch = self.workload.batch
            return [batch(step * n + i, plan.micro_batch, plan.seq_len, self.device) for i in range(n)]
        inputs, targets = synthetic_batch(
            self.config.model,
            batch=plan.global_batch,
            seq_len=plan.seq_len,
            step=step,
            seed=self.config.seed,
            rows=dp_rows(plan, self.dp_rank),
            device=self.device,
        )
        if plan.cp > 1:
            inputs, targets = inputs[:, self.cp_span], targets[:, self.cp_span]
        return list(zip(inputs.chunk(n), targets.chunk(n), strict=True))

    def step(self, step: int) -> tuple[torch.Tensor, float]:
        micro, n = self._micro_batches(step), self.plan.num_microbatches
        if self.plan.pp > 1:
            return self.engine.train_batch(data_iter=iter(micro)).detach(), 1.0
        loss_fn = (self.workload.loss if self.workload is not None else None) or lm_loss
        total = torch.zeros((), device=self.device)
        for x, y in micro:
            loss = loss_fn(self.engine(x), y)
            self.engine.backward(loss)  # DeepSpeed divides by the accumulation steps itself
            self.engine.step()  # steps the optimizer at the accumulation boundary only
            total += loss.detach()
        return total / n, 1.0

    def close(self) -> None:
        """Drop the engine before ``destroy_process_group`` (PLATFORM.md: avoids the exit-time abort)."""
        if hasattr(self.engine, "destroy"):
            self.engine.destroy()
        del self.engine, self.optimizer, self.modules
