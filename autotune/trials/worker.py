"""The trial worker: ``python -m autotune.trials.worker --trial-dir D``, one process per rank under torchrun.

Reads ``plan.json`` and ``trial.json`` (layout in ``autotune.trials.config``), runs warm-up steps, then
measured steps timed with a device synchronize, and writes the ``TrialResult`` to ``result.json``
(rank 0). A rank that fails writes ``result.rank<r>.json`` (``oom`` for ``torch.OutOfMemoryError``,
else ``error``; ``rendezvous_error`` when the process group cannot form) and exits 1, so that torchrun
stops the other ranks. Rank 0 appends every measured step to ``progress.jsonl`` for the pruner.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (reserved bytes in ``extra``). On the CPU
there are no allocator statistics, so the worker runs ``MemTracker`` (torch.distributed._tools) over
the last warm-up step -- it counts live tensor storage (parameters, gradients, optimizer states,
activations) and so is comparable with an analytic model -- and falls back to the growth of the
process's peak RSS (``ru_maxrss``) since start-up when that fails; ``extra.peak_memory_method`` says
which. Measured steps are never tracked, so tracking does not slow the timings.

deepspeed is imported only for ``framework: deepspeed`` plans: this module runs on GPU machines
without deepspeed or optuna.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.errors import TrialError
from autotune.modelshape import trial_model_gap
from autotune.plan import Framework, ParallelPlan
from autotune.trials.config import FAULT_ENV, FAULT_RANK_ENV, FAULT_STEP_ENV, TrialConfig, slowdown_s
from autotune.trials.cpu import CPU_AFFINITY_ENV, cpu_share
from autotune.trials.model import model_flops_per_token
from autotune.trials.result import TrialResult, TrialStatus

__all__ = ["main", "init_distributed", "make_trainer", "run_trial", "pin_cpu_threads"]

_RSS_AT_START = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker if torchrun's agent dies (no orphans after a hard kill)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


def _marker(trial_dir: Path, name: str, rank: int) -> None:
    (trial_dir / f"{name}.{rank}").write_text(f"{os.getpid()}\n")


def pin_cpu_threads() -> int:
    """CPU trials: this local rank's intra-op threads (and cores, when pinned) by ``trials.cpu.cpu_share``;
    one inter-op thread. ``OMP_NUM_THREADS`` wins when set explicitly. Returns the thread count."""
    allowed = sorted(os.sched_getaffinity(0))
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    single_node = int(os.environ.get("WORLD_SIZE", ranks)) <= ranks
    share, pin = cpu_share(len(allowed), ranks, single_node=single_node)
    pin = {"1": True, "0": False}.get(os.environ.get(CPU_AFFINITY_ENV, ""), pin)
    if pin and len(allowed) >= ranks:
        local = int(os.environ.get("LOCAL_RANK", 0))
        os.sched_setaffinity(0, allowed[local * share : (local + 1) * share])
    threads = int(os.environ.get("OMP_NUM_THREADS") or share)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # inter-op parallelism already started in this process
        pass
    return threads


def init_distributed(device_pref: str = "auto") -> torch.device:
    """cuda -> nccl, cpu -> gloo; env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun)."""
    use_cuda = device_pref == "cuda" or (device_pref == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        pin_cpu_threads()
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {"device_id": device} if use_cuda else {}
        dist.init_process_group("nccl" if use_cuda else "gloo", **kwargs)
    return device


def make_trainer(plan: ParallelPlan, config: TrialConfig, device: torch.device):
    if plan.moe_capacity_factor is not None and not config.workload:
        raise TrialError("the built-in trial MoE routes dropless: a capacity factor needs your --workload")
    if not config.workload and (gap := trial_model_gap(config.model)):  # as `autotune search` refuses it
        raise TrialError(f"the built-in trial model has no {gap}: run your own model (--workload / --script)")
    if plan.framework is Framework.DEEPSPEED:
        from autotune.trials.deepspeed_engine import DeepSpeedTrainer

        return DeepSpeedTrainer(plan=plan, config=config, device=device)
    if plan.framework is Framework.MEGATRON:
        raise NotImplementedError("Megatron trials are not implemented; use --framework fsdp or deepspeed")
    if config.workload:  # the user's model and batches (autotune.workload)
        from autotune.trials.custom import WorkloadTrainer

        return WorkloadTrainer(plan=plan, config=config, device=device)
    from autotune.trials.train import NativeTrainer

    return NativeTrainer(plan=plan, config=config, device=device)


def _maybe_fault(step: int) -> None:
    fault = os.environ.get(FAULT_ENV)
    if not fault:
        return
    world = dist.get_world_size()
    if dist.get_rank() != int(os.environ.get(FAULT_RANK_ENV, world - 1)):
        return
    if step != int(os.environ.get(FAULT_STEP_ENV, 1)):
        return
    if fault == "crash":
        raise RuntimeError(f"injected crash ({FAULT_ENV}=crash) before step {step}")
    if fault == "oom":
        raise torch.OutOfMemoryError(f"injected out-of-memory ({FAULT_ENV}=oom) before step {step}")
    if fault == "exit":
        os._exit(3)
    if fault == "hang":
        time.sleep(10**6)
    raise ValueError(f"{FAULT_ENV}={fault!r} is not a known fault")


def _tracked_step(trainer, step: int) -> tuple[torch.Tensor, float, float | None]:
    """One step under MemTracker; its peak of live CPU tensor bytes (None where it cannot track)."""
    if not trainer.memory_trackable:  # pipelines and DeepSpeed: the RSS fallback
        return *trainer.step(step), None
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(*trainer.modules, trainer.optimizer)
    trainer.microbatch_hook = tracker.reset_mod_stats  # it rejects a module run twice otherwise
    try:
        with tracker:
            loss, weight = trainer.step(step)
    finally:
        trainer.microbatch_hook = None
    peak = sum(sum(v.values()) for v in tracker.get_tracker_snapshot("peak").values())
    return loss, weight, float(peak)


def _run_steps(
    trainer, plan: ParallelPlan, config: TrialConfig, device: torch.device, progress: Path | None
) -> tuple[list[float], list[torch.Tensor], list[float], float | None]:
    times, losses, weights, tracked = [], [], [], None
    tokens_per_step = plan.tokens_per_step
    slowdown = slowdown_s()  # AUTOTUNE_SLOWDOWN_MS: a diagnostic knob (trials/config.py)
    try:
        for step in range(config.warmup_steps + config.measure_steps):
            _maybe_fault(step)
            if step == config.warmup_steps:  # as timeit does: no collector pause inside a timed step
                gc.collect()
                gc.disable()
            start = time.perf_counter()
            time.sleep(slowdown)
            if device.type == "cpu" and step == config.warmup_steps - 1:
                loss, weight, tracked = _tracked_step(trainer, step)
            else:
                loss, weight = trainer.step(step)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            times.append(elapsed)
            losses.append(loss.detach().float().reshape(()))
            weights.append(weight)
            measured = step - config.warmup_steps
            if progress is not None and measured >= 0:
                with progress.open("a") as f:
                    f.write(
                        json.dumps(
                            {
                                "step": measured,
                                "step_time_s": elapsed,
                                "time": time.time(),
                                "tokens_per_s": tokens_per_step / elapsed,
                            }
                        )
                        + "\n"
                    )
    finally:
        gc.enable()
    return times, losses, weights, tracked


def _peak_memory(device: torch.device, tracked: float | None) -> tuple[float, str, dict[str, float]]:
    if device.type == "cuda":
        return (
            float(torch.cuda.max_memory_allocated(device)),
            "torch.cuda.max_memory_allocated",
            {"peak_reserved_bytes": float(torch.cuda.max_memory_reserved(device))},
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _RSS_AT_START
    if tracked is not None:
        return tracked, "MemTracker (last warm-up step)", {"peak_rss_growth_bytes": float(rss)}
    return float(rss), "ru_maxrss growth since start-up", {}


def _reduce(values: list[float], device: torch.device, op: dist.ReduceOp) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def run_trial(
    trial_dir: Path, *, plan: ParallelPlan, config: TrialConfig, device: torch.device
) -> TrialResult:
    """Build, warm up, measure; every rank returns the same ``TrialResult`` (ranks agree by all-reduce)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = make_trainer(plan, config, device)
    progress = trial_dir / "progress.jsonl" if dist.get_rank() == 0 else None
    times, losses, weights, tracked = _run_steps(trainer, plan, config, device, progress)
    peak, method, mem_extra = _peak_memory(device, tracked)
    close = getattr(trainer, "close", None)
    del trainer
    if close is not None:
        close()
    gc.collect()
    weighted = [float(loss) * w for loss, w in zip(losses, weights, strict=True)]
    sums = _reduce([*weighted, *weights], device, dist.ReduceOp.SUM)
    n = len(losses)
    step_losses = [s / max(c, 1e-12) for s, c in zip(sums[:n], sums[n:], strict=True)]
    times = _reduce(times, device, dist.ReduceOp.MAX)  # a step is as slow as its slowest rank
    (peak,) = _reduce([peak], device, dist.ReduceOp.MAX)
    extra = {
        "peak_memory_method": method,
        **mem_extra,
        "losses": step_losses,
        "step_times_s": times,
        "device": device.type,
        "world_size": dist.get_world_size(),
        "warmup_steps": config.warmup_steps,
    }
    return _result(plan, config, times[config.warmup_steps :], step_losses, peak, extra)


def _result(
    plan: ParallelPlan,
    config: TrialConfig,
    measured: list[float],
    losses: list[float],
    peak: float,
    extra: dict[str, Any],
) -> TrialResult:
    median = statistics.median(measured)
    mean = statistics.fmean(measured)
    cov = statistics.pstdev(measured) / mean if len(measured) > 1 else 0.0
    tokens_per_s = plan.tokens_per_step / median
    mfu = None
    if config.peak_flops_per_gpu:
        flops = model_flops_per_token(config.model, plan.seq_len) * tokens_per_s
        mfu = flops / (plan.world_size * config.peak_flops_per_gpu)
    return TrialResult(
        status=TrialStatus.OK,
        tokens_per_s=tokens_per_s,
        step_time_s=median,
        step_time_cov=cov,
        peak_memory_bytes=peak,
        mfu=mfu,
        loss=losses[-1],
        extra=extra,
    )


def _fail(trial_dir: Path, rank: int, status: TrialStatus, exc: BaseException) -> None:
    line = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    TrialResult(status=status, error=f"rank {rank}: {line}").write(trial_dir / f"result.rank{rank}.json")
    import traceback

    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)  # no teardown: peers may be blocked in a collective; torchrun stops them


def _teardown() -> None:
    """barrier, drop the engine, gc, destroy: the sequence that avoids gloo's exit-time abort."""
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autotune.trials.worker")
    parser.add_argument("--trial-dir", type=Path, required=True)
    trial_dir = parser.parse_args(argv).trial_dir.resolve()
    rank = int(os.environ.get("RANK", 0))
    _die_with_parent()
    _marker(trial_dir, "started", rank)
    try:
        plan = ParallelPlan.from_dict(json.loads((trial_dir / "plan.json").read_text()), where="plan.json")
        config = TrialConfig.read(trial_dir / "trial.json")
    except Exception as e:
        _fail(trial_dir, rank, TrialStatus.ERROR, e)
    if config.script:  # the user's script forms its own process group and reports (autotune.contract)
        from autotune.trials.script import run_script

        run_script(trial_dir, config, rank)
    try:
        device = init_distributed(config.device)
    except Exception as e:  # the store or the peers never answered
        _fail(trial_dir, rank, TrialStatus.RENDEZVOUS_ERROR, e)
    _marker(trial_dir, "joined", rank)
    try:
        result = run_trial(trial_dir, plan=plan, config=config, device=device)
    except torch.OutOfMemoryError as e:
        _fail(trial_dir, rank, TrialStatus.OOM, e)
    except Exception as e:
        _fail(trial_dir, rank, TrialStatus.ERROR, e)
    if rank == 0:
        result.write(trial_dir / "result.json")
    _teardown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter finalisation (~1.5 s of module teardown per trial); nothing is left open


if __name__ == "__main__":
    main()
