"""``autotune probe``: microbenchmarks of the present devices, and the hardware profile they produce.

``gemm`` and ``collectives`` measure (they import torch); ``worker`` runs them on every rank under torchrun;
``fit`` turns the measurements into a profile mapping; ``profile`` writes, reads and applies one to a
``ClusterSpec`` (torch-free, so ``estimate --profile`` stays fast).
"""

from autotune.probe.profile import Profile, apply_profile, load_profile

__all__ = ["Profile", "apply_profile", "load_profile"]
