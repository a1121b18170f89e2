"""Tier-2 harness: run a function on ``world_size`` gloo ranks in fresh processes, with a hard timeout.

``run_on_ranks(fn, world_size)`` spawns the ranks with ``torch.multiprocessing`` on a free port, retries
when the port was taken between choosing and binding ("Address already in use"), and returns each
rank's return value (pickled through a file). ``fn(rank, world_size, *args)`` must be importable
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

_PORT_TAKEN = "Address already in use"


class RanksFailed(RuntimeError):
    """A rank raised, or the ranks did not finish within the timeout."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, out: str, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
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
        ctx = mp.spawn(_entry, args=(fn, world_size, free_port(), out, args), nprocs=world_size, join=False)
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


def run_on_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0, retries: int = 3
) -> list[Any]:
    """``[fn(0, ws, *args), ..., fn(ws-1, ws, *args)]``, each in its own process on one gloo group."""
    for attempt in range(retries):
        results = _spawn(fn, world_size, args, timeout_s)
        errors = [v for status, v in results if status == "error"]
        if not errors:
            return [v for _, v in results]
        if attempt + 1 < retries and any(_PORT_TAKEN in e for e in errors):
            continue
        raise RanksFailed("\n".join(errors))
    raise AssertionError("unreachable")
