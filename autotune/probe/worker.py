"""The probe on every rank: ``python -m autotune.probe.worker --out RAW.json ...`` under torchrun.

``autotune probe`` starts it with ``torchrun --standalone`` (one node), or runs it in-process when itself
launched by torchrun across nodes. Order: GEMMs and a memory copy on every rank at once (ranks share a node
as trial ranks do), then every collective inside each node (all nodes at once), then across all ranks when
there is more than one node, then how much of an all-reduce hides behind GEMMs inside a node
(``probe.overlap``), and on a CPU the host time per eager operator (``probe.overhead``) and per pipeline
schedule action (``probe.pipeline``). Rank 0 writes the raw measurements as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.probe.collectives import collective_sweep, message_sizes
from autotune.probe.gemm import copy_bytes_per_s, default_shapes, gemm_sweep
from autotune.probe.overhead import op_overhead as run_op_overhead
from autotune.probe.overlap import overlap_fraction
from autotune.probe.pipeline import pipeline_action_overhead

__all__ = ["run_probe", "finish", "main"]

_MIB = 1024**2


def _init(device_type: str) -> torch.device:
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=device)
        return device
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return torch.device("cpu")


def _gemm(device: torch.device, quick: bool) -> list[dict[str, Any]]:
    """Every rank's sweep, reduced to the median rank per shape and dtype."""
    shapes = default_shapes(device.type, quick=quick)
    if device.type == "cuda":
        results = gemm_sweep(device, dtypes=["bf16", "fp16", "fp32"], shapes=shapes)
    else:  # bf16 GEMMs are slow on CPUs without AMX: the small shapes only
        results = gemm_sweep(device, dtypes=["fp32"], shapes=shapes) + gemm_sweep(
            device, dtypes=["bf16"], shapes=default_shapes("cpu", quick=True)
        )
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [r.to_dict() for r in results])
    merged = []
    for i, row in enumerate(everyone[0]):
        rates = [ranks[i]["flops_per_s"] for ranks in everyone]
        merged.append(
            row
            | {
                "flops_per_s": statistics.median(rates),
                "flops_per_s_min_rank": min(rates),
                "seconds": 2.0 * row["m"] * row["n"] * row["k"] / statistics.median(rates),
            }
        )
    return merged


def run_probe(
    *, device_type: str, min_bytes: int, max_bytes: int, quick: bool, sweeps: int = 3
) -> dict[str, Any] | None:
    """Measure; the raw record on rank 0, None elsewhere."""
    device = _init(device_type)
    world, rank = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = world // local
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), list(os.getloadavg())
    gemm = _gemm(device, quick)
    copy = copy_bytes_per_s(device, nbytes=(16 if device_type == "cpu" else 512) * _MIB)
    sizes = message_sizes(min_bytes, max_bytes)
    node_groups = [dist.new_group(list(range(i * local, (i + 1) * local))) for i in range(nodes)]
    collectives = []
    if local > 1:
        collectives += collective_sweep(
            device, sizes=sizes, group=node_groups[rank // local], scope="intra", sweeps=sweeps
        )
    if nodes > 1:
        collectives += collective_sweep(
            device, sizes=sizes, group=dist.group.WORLD, scope="inter", sweeps=sweeps
        )
    op_overhead = run_op_overhead() if device.type == "cpu" else None  # every rank at once, as trials run
    # like the operators, a CPU-only figure: on GPUs the schedule's host work runs ahead of the kernels
    pipeline = pipeline_action_overhead(device, local_world_size=local) if device.type == "cpu" else None
    # all nodes at once, as a DP group's ranks overlap in training
    overlap = overlap_fraction(device, node_groups[rank // local]) if local > 1 else None
    copies: list[Any] = [None] * world
    dist.all_gather_object(copies, copy)
    if rank != 0:
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {
        "device": device.type,
        "device_name": name,
        "world_size": world,
        "local_world_size": local,
        "num_nodes": nodes,
        "torch": torch.__version__,
        "host": platform.node(),
        "omp_num_threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0)),
        "collective_sweeps": sweeps,
        "started": started,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_avg_before": load_before,
        "load_avg_after": list(os.getloadavg()),
        "gemm": gemm,
        "copy_bytes_per_s": statistics.median(copies),
        "collectives": [c.to_dict() for c in collectives],
        "overlap": overlap,
        "op_overhead": op_overhead,
        "pipeline": pipeline,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m autotune.probe.worker")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=256 * _MIB)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweeps", type=int, default=3)
    args = ap.parse_args(argv)
    raw = run_probe(
        device_type=args.device,
        min_bytes=args.min_bytes,
        max_bytes=args.max_bytes,
        quick=args.quick,
        sweeps=args.sweeps,
    )
    if raw is not None:
        args.out.write_text(json.dumps(raw, indent=2) + "\n")
    finish()


def finish() -> None:
    """barrier, gc, destroy: the teardown that avoids gloo's exit-time abort (PLATFORM.md)."""
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
