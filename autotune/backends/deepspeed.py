"""``deepspeed``: each trial runs ``deepspeed.initialize`` with the emitted ds_config, launched by torchrun.

torchrun rather than the ``deepspeed`` launcher: DeepSpeed reads the same ``env://`` variables, and one
launcher keeps the timeout, cleanup and classification of ``autotune.trials.runner`` identical for both
stacks (the ``deepspeed`` CLI would also need ``--num_gpus`` on CPU nodes).
"""

from __future__ import annotations

from autotune.backends.torchrun import TorchrunBackend
from autotune.plan import Framework

__all__ = ["DeepSpeedBackend"]


class DeepSpeedBackend(TorchrunBackend):
    name = "deepspeed"
    framework = Framework.DEEPSPEED
