"""Your own model in autotune's trials: ``autotune search ... --workload pkg.module:build``.

The builder is called once per rank inside each trial::

    def build(spec: ModelSpec, plan: ParallelPlan, device: torch.device) -> Workload

``spec`` is the ``--model`` shape (the cost model prices it; use it or ignore it), ``plan`` the plan this
trial measures (degrees, micro-batch, recompute...), ``device`` this rank's device. Build the model on
``device`` with weights initialised; the global RNG is seeded identically on every rank beforehand, so
data-parallel replicas start equal. autotune then applies the plan to ``Workload.model`` in the trial's
order: tensor parallelism on the submodules ``tp_plan`` names, activation checkpointing per block, FSDP2 (or
replication) per block then the root; it runs AdamW, warm-up and measured steps and reports tokens/s exactly
as for the built-in model. A runnable example is ``examples/custom_workload/build.py``.

What a workload cannot do fails its trial with a one-line reason (and the sampler steers away): TP > 1
without ``tp_plan``, selective recompute without ``selective``. Pipeline and context parallelism are not
applied to your model: the search pins PP = 1 and CP = 1.

This module imports no torch: ``load_builder`` runs in the search process before any trial launches.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Workload", "TP_STYLES", "load_builder", "import_root"]

TP_STYLES = ("colwise", "rowwise")
"""Megatron's pair: a column-parallel linear shards its output features, the row-parallel one that follows
consumes them sharded and all-reduces its output."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What ``build(spec, plan, device)`` returns."""

    model: nn.Module
    """On ``device``, initialised. ``model(inputs)`` gives the outputs ``loss`` takes."""
    batch: Callable[[int, int, int, torch.device], tuple[Any, torch.Tensor]]
    """``batch(step, micro_batch, seq_len, device) -> (inputs, labels)``: one micro-batch of this rank;
    ``step`` counts the rank's micro-batches from 0 (``optimizer_step * grad_accum + i``)."""
    loss: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
    """``loss(outputs, labels)`` averaged over the micro-batch; None: next-token cross-entropy of logits
    ``[batch, seq, vocab]`` against labels ``[batch, seq]``."""
    block: type | tuple[type, ...] | None = None
    """The transformer block class(es). FSDP2 shards each block as one unit and full recompute
    checkpoints each; None: the whole model is one unit."""
    tp_plan: Mapping[str, str] = field(default_factory=dict)
    """Inside a block: submodule name -> ``colwise`` | ``rowwise``, e.g. ``{"attn.qkv": "colwise",
    "attn.out": "rowwise", "mlp.up": "colwise", "mlp.down": "rowwise"}``. Required for TP > 1. Code
    between the pair sees local (1/TP) widths: derive head counts from tensor shapes, not the config."""
    selective: tuple[str, ...] = ()
    """Inside a block: submodules that selective recompute checkpoints (e.g. the attention core)."""


def _split(target: str) -> tuple[str, str]:
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in (*module.split("."), attr)):
        raise ConfigError(
            f"--workload {target!r}: expected MODULE:FUNCTION, e.g. examples.custom_workload.build:build"
        )
    return module, attr


def load_builder(target: str) -> Callable[..., Workload]:
    """Import ``pkg.module:function`` (the current directory first on the path, as ``python -m`` does);
    ``ConfigError`` in one line when it cannot be imported or is not callable."""
    module_name, attr = _split(target)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's code: any import-time failure is a bad --workload
        line = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ConfigError(f"--workload {target!r}: cannot import {module_name} ({line})") from None
    builder = getattr(module, attr, None)
    if not callable(builder):
        what = "is not callable" if builder is not None else "does not exist"
        raise ConfigError(
            f"--workload {target!r}: {module_name}.{attr} {what}; expected "
            "build(spec, plan, device) -> autotune.workload.Workload"
        )
    return builder  # type: ignore[no-any-return]


def import_root(target: str) -> str:
    """The ``sys.path`` entry that imports ``target``'s module (for the trial workers' ``PYTHONPATH``)."""
    module_name, _ = _split(target)
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    origin = Path(module.__file__ or ".").resolve()
    if origin.name == "__init__.py":
        origin = origin.parent
    return str(origin.parents[module_name.count(".")])
