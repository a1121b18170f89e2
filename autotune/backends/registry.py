"""``get_backend(name, ...)``: simulate | torchrun | deepspeed | auto.

``auto`` runs real trials when they can run here: this node has at least the cluster's GPUs per node
(``torch.cuda.device_count()``) and the cluster is this one node, or ``--device cpu`` asks for CPU trials on
gloo (all ranks as local processes). Otherwise it plans with the cost model and says so in one line, with
how to measure. A multi-node cluster is planned, not measured, unless an ``executor`` starts its nodes
(``slurm``: a job or an ``srun`` step per trial; ``multinode``: every agent here on loopback, for tests),
and then every ``auto`` trial is real. torch is imported only when a GPU driver is present, so planning
on a laptop stays fast.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from autotune.backends.base import Backend
from autotune.backends.simulate import SimulateBackend
from autotune.errors import ConfigError
from autotune.plan import Framework
from autotune.specs import ClusterSpec

__all__ = ["BACKENDS", "BackendChoice", "get_backend", "local_gpu_count"]

BACKENDS = ("auto", "simulate", "torchrun", "deepspeed")
_REAL = {  # backend -> (module, class, frameworks it can run)
    "torchrun": ("autotune.backends.torchrun", "TorchrunBackend", frozenset({Framework.FSDP})),
    "deepspeed": ("autotune.backends.deepspeed", "DeepSpeedBackend", frozenset({Framework.DEEPSPEED})),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendChoice:
    backend: Backend
    frameworks: frozenset[Framework] | None
    """Frameworks it can run (None: any); the search leaves the others out of the space."""
    note: str | None = None
    """One line for the user, e.g. that results are predictions and how to measure."""


class _ByFramework:
    """Real trials: each plan goes to the backend of its framework."""

    measures = True

    def __init__(self, backends: dict[Framework, Backend]) -> None:
        self._backends = backends
        self.name = "+".join(b.name for b in backends.values())

    def run(self, request, report=None):  # type: ignore[no-untyped-def]
        return self._backends[request.plan.framework].run(request, report)


def local_gpu_count() -> int:
    """CUDA/ROCm devices torch sees here; 0 without a driver (checked before importing torch)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")):
        return 0
    import torch

    return int(torch.cuda.device_count())


def get_backend(name: str, *, cluster: ClusterSpec, device: str | None = None,
                executor: str = "local") -> BackendChoice:
    """The backend for ``--backend NAME --device DEV`` on this node; ``executor``: where its trials run
    (``autotune.executors``: local | multinode | slurm)."""
    if name == "simulate":
        return BackendChoice(backend=SimulateBackend(), frameworks=None,
                             note="simulate: tokens/s are the cost model's predictions")
    if name in _REAL:
        return BackendChoice(backend=_load(name, device, executor), frameworks=_REAL[name][2])
    if name != "auto":
        raise ConfigError(f"--backend: unknown backend '{name}'; known: {', '.join(BACKENDS)}")
    have = 0 if device == "cpu" else local_gpu_count()
    here = have >= cluster.gpus_per_node and cluster.num_nodes == 1
    if executor != "local" or device == "cpu" or here:
        backends = {fw: _load(n, device or "cuda", executor)
                    for n, (_, _, fws) in _REAL.items() for fw in fws}
        return BackendChoice(backend=_ByFramework(backends), frameworks=frozenset(backends))
    if device == "cuda":
        raise ConfigError(f"--device cuda: this node has {have} CUDA GPUs; the plan needs "
                          f"{cluster.num_nodes} node(s) of {cluster.gpus_per_node}; drop --device to plan "
                          "with the cost model")
    if cluster.num_nodes == 1:
        why = (f"this node has {have} of the {cluster.gpus_per_node} GPUs; to measure, run the same command "
               "on the GPU node")
    else:
        why = (f"the plan spans {cluster.num_nodes} nodes; measure on the cluster with --executor slurm, or "
               "run the best plan with its launch files in best/ (launch_slurm.sbatch, ...)")
    return BackendChoice(backend=SimulateBackend(), frameworks=None,
                         note=f"planning with the cost model (predictions, not measurements): {why}")


def _load(name: str, device: str | None, executor: str = "local") -> Backend:
    module, cls, _ = _REAL[name]
    try:
        backend_cls = getattr(importlib.import_module(module), cls)
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(f"--backend {name}: {module}.{cls} is not available in this install; "
                          "use --backend simulate to plan with the cost model") from None
    return backend_cls(device=device or "cuda", executor=executor)  # type: ignore[no-any-return]
