"""Checks a search makes before its first trial, each a one-line ``ConfigError`` within a second.

Real trials fail late and noisily when the machine cannot run them: with no CUDA device, every torchrun
trial dies after ~20 s in its rendezvous with 35 lines of traceback, and the study is left behind with the
wrong batch. So before anything is written or launched:

* ``check_trials_can_run`` (a torchrun backend's ``preflight``): the devices the backend needs are here
  (CUDA GPUs for ``--device cuda``), and so is the launcher (torch for torchrun, deepspeed for its backend,
  ``sbatch``/``srun`` for Slurm);
* ``check_writable``: the runs directory can be created and written (``--out``), without creating it.

The storage is checked where it is opened (``autotune.store.open_study``: one line for any URL), and the
study's identity against this run's (``autotune.store``: a refused study names ``--resume``, ``--force`` and
``--study NEW``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from autotune.errors import ConfigError
from autotune.specs import ClusterSpec

__all__ = ["check_trials_can_run", "check_writable", "local_gpu_count"]


def local_gpu_count() -> int:
    """CUDA/ROCm devices torch sees here; 0 without a driver (checked before importing torch)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")):
        return 0
    import torch

    return int(torch.cuda.device_count())


def check_trials_can_run(*, backend: str, device: str | None, executor: str, cluster: ClusterSpec) -> None:
    """``ConfigError`` when the real trials of ``--backend``/``--device``/``--executor`` cannot start here."""
    if executor == "slurm":
        if not (shutil.which("sbatch") or shutil.which("srun")):
            raise ConfigError(
                "--executor slurm: neither sbatch nor srun is on PATH; run on a Slurm login or "
                "compute node, or use --executor local"
            )
        return
    if importlib.util.find_spec("torch") is None:
        raise ConfigError(
            f"--backend {backend}: torch is not installed for {sys.executable} (trials run "
            "python -m torch.distributed.run); install torch, or --backend simulate to plan"
        )
    if backend == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                "--backend deepspeed: deepspeed is not installed here; pip install deepspeed, "
                "or --framework fsdp"
            )
    if (device or "cuda") == "cuda":
        _check_cuda(backend, cluster)


def _check_cuda(backend: str, cluster: ClusterSpec) -> None:
    have = local_gpu_count()
    need = cluster.gpus_per_node if cluster.num_nodes > 1 else cluster.num_gpus
    if have >= need:
        return
    here = "no CUDA GPU" if not have else f"{have} CUDA GPU(s)"
    raise ConfigError(
        f"--backend {backend}: this node has {here} and each trial needs {need}; pass "
        "--device cpu to run the trials as CPU processes (gloo), or --backend simulate to plan"
    )


def check_writable(path: str | Path, flag: str) -> None:
    """``path`` is a directory that can be written, or can be created: checked without creating it."""
    where = Path(path).absolute()
    existing = where
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        what = "exists and is not a directory" if existing == where else f"{existing} is not a directory"
        raise ConfigError(f"{flag} {path}: {what}; pass a directory")
    if not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing):
        raise ConfigError(f"{flag} {path}: {existing} is not writable; pass a writable directory")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
