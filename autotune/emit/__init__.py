"""Emitters: ParallelPlan -> the files a user launches (DeepSpeed, accelerate FSDP2, torchrun/torchtitan,
Megatron-LM, launch scripts, Kubernetes). Each ``to_*`` function is pure; ``emit_all`` writes them all.

An artefact whose framework cannot run the plan as priced is not emitted; ``*_unsupported(plan)`` says why
and ``summary.md`` repeats it.
"""

from autotune.emit.deepspeed import check_ds_config, deepspeed_unsupported, to_ds_config
from autotune.emit.fsdp import accelerate_unsupported, to_accelerate_config, transformer_layer_cls
from autotune.emit.megatron import megatron_args, megatron_unsupported
from autotune.emit.planfile import PlanDocument, plan_document, read_plan_document
from autotune.emit.torchrun import torchrun_args, worker_args
from autotune.emit.torchtitan import to_torchtitan_config, torchtitan_unsupported
from autotune.emit.writer import ARTEFACT_FILES, emit_all, own_file_unsupported, remove_emitted

__all__ = [
    "emit_all",
    "ARTEFACT_FILES",
    "own_file_unsupported",
    "remove_emitted",
    "to_ds_config",
    "check_ds_config",
    "deepspeed_unsupported",
    "to_accelerate_config",
    "accelerate_unsupported",
    "transformer_layer_cls",
    "torchrun_args",
    "worker_args",
    "to_torchtitan_config",
    "torchtitan_unsupported",
    "megatron_args",
    "megatron_unsupported",
    "PlanDocument",
    "plan_document",
    "read_plan_document",
]
