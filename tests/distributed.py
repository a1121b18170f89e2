"""Tier-2 harness: run a function on ``world_size`` gloo ranks in fresh processes, with a hard timeout.

``run_on_ranks(fn, world_size)`` spawns the ranks with ``torch.multiprocessing``, which meet through a
``FileStore`` in the run's own temporary folder (no TCP port: a port chosen free and bound later can be
taken meanwhile by a neighbour's process, whose store the ranks then wait on until the timeout), and
returns each rank's return value (pickled through a file). ``fn(rank, world_size, *args)`` must be importable
(module level). The process group is torn down as PLATFORM.md prescribes (barrier, gc, destroy).
Trial-level tests use ``autotune.trials.runner`` instead; this harness is for code below the worker.
"""

from __future__ import annotations

import gc
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["free_port", "run_on_ranks", "RanksFailed"]


class RanksFailed(RuntimeError):
    """A rank raised, or the ranks did not finish within the timeout."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world_size: int, out: str, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        store = f"file://{Path(out, 'store')}"
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world_size)
        value = fn(rank, world_size, *args)
        dist.barrier()
        gc.collect()
        dist.destroy_process_group()
        payload: tuple[str, Any] = ("ok", value)
    except BaseException:
        payload = ("error", traceback.format_exc())
    Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(payload))


def _spawn(fn: Callable[..., Any], world_size: int, args: tuple, timeout_s: float) -> list[tuple[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.spawn(_entry, args=(fn, world_size, out, args), nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise RanksFailed(f"ranks did not finish within {timeout_s:g} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join()
        return [pickle.loads(Path(out, f"{r}.pkl").read_bytes()) for r in range(world_size)]


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> list[Any]:
    """``[fn(0, ws, *args), ..., fn(ws-1, ws, *args)]``, each in its own process on one gloo group."""
    results = _spawn(fn, world_size, args, timeout_s)
    errors = [v for status, v in results if status == "error"]
    if errors:
        raise RanksFailed("\n".join(errors))
    return [v for _, v in results]
