"""Notes of ``summary.md`` on what the plan asks of the user's script: DeepSpeed's (where its config cannot
say it) and the stored dtypes / loss kernel a framework fsdp plan was priced with."""

from __future__ import annotations

from autotune.plan import LossKernel, ParallelPlan, Recompute, StoreDtype

__all__ = ["deepspeed_notes", "stored_dtype_note"]


def deepspeed_notes(plan: ParallelPlan) -> list[str]:
    """What a DeepSpeed train.py must set itself (recompute, CPU Adam, pipeline module, AutoTP, Ulysses)."""
    notes: list[str] = []
    if plan.recompute is not Recompute.NONE:
        what = "the attention core" if plan.recompute is Recompute.SELECTIVE else "each block"
        notes.append(
            "- DeepSpeed: activation_checkpointing configures deepspeed.checkpointing; the model "
            f"code decides what to recompute ({plan.recompute}: {what})."
        )
    if plan.offload:
        notes.append(
            "- DeepSpeed offload: create the optimizer as deepspeed.ops.adam.DeepSpeedCPUAdam "
            "(DeepSpeed insists by default; the step-time estimate assumes its speed)."
        )
    if plan.pp > 1:
        notes.append(
            f"- DeepSpeed pipeline: build the model as deepspeed.pipe.PipelineModule(num_stages="
            f"{plan.pp}, partition_method='uniform') and train with engine.train_batch() (the stage "
            "count and partition are PipelineModule arguments; ds_config cannot set them)."
        )
    if plan.tp > 1:
        notes.append(
            f"- DeepSpeed AutoTP: after deepspeed.init_distributed() call deepspeed.utils.groups."
            "_init_tp_mesh_device("
            f"tensor_model_parallel_size={plan.tp}) and pass mpu=deepspeed.utils.groups to "
            "deepspeed.initialize; without an mpu DeepSpeed counts the TP ranks as data parallel, "
            "rejects train_batch_size and (left out) reports TP times the global batch."
        )
    if plan.cp > 1:
        notes.append(
            "- DeepSpeed-Ulysses (sequence_parallel_size "
            f"{plan.cp}): after deepspeed.init_distributed() call deepspeed.runtime.sequence_parallel."
            f"parallel_state_sp.initialize_sequence_parallel({plan.cp}) and pass that module as mpu to "
            "deepspeed.initialize (ZeRO then shards over DP x CP); wrap each layer's attention in "
            "deepspeed.sequence.layer.DistributedAttention(local_attention, parallel_state_sp."
            "get_sequence_parallel_group()), and give each rank its 1/"
            f"{plan.cp} of every sequence (consecutive ranks hold consecutive slices; rotary / position "
            "ids of the full sequence). Hugging Face models: deepspeed.runtime.sequence_parallel.ulysses_sp."
            "UlyssesSPAttentionHF.register_with_transformers does the wrapping."
        )
    return notes


def stored_dtype_note(plan: ParallelPlan) -> str:
    """What a train.py must do for the stored dtypes the plan was priced with (autotune's trainer does it)."""
    parts = []
    if plan.weight_dtype is StoreDtype.BF16:
        moments = "bf16 (torch.optim.AdamW)" if plan.moment_dtype is StoreDtype.BF16 else "fp32"
        parts.append(f"build the model in bf16 (torch_dtype=torch.bfloat16, no master), moments {moments}")
    elif plan.moment_dtype is StoreDtype.BF16:
        parts.append("keep Adam's moments in bf16")
    loss = _LOSS_NOTE.get(plan.loss_kernel)
    return f"- Priced numerics: {'; '.join(parts + ([loss] if loss else []))}." if parts or loss else ""


_LOSS_NOTE = {
    LossKernel.BF16: "take the cross-entropy of the bf16 logits (no .float())",
    LossKernel.FUSED: "a fused cross-entropy that keeps the bf16 logits (flash-attn's CrossEntropyLoss)",
    LossKernel.CHUNKED: "the head and loss in chunks (Liger's LigerFusedLinearCrossEntropyLoss)",
}
