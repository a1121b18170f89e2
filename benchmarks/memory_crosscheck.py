"""Cross-check the analytic memory model (autotune/costmodel/memory.py) against MEASURED per-rank peaks.

The workload is the trials' own model (autotune/trials/model.py) with the trials' loss and optimizer
(fp32 cross-entropy, ``AdamW(foreach=True)``) and two micro-batches of gradient accumulation, so the
gradients of the first micro-batch are alive during the second one's forward, as in training.

CPU (default), plain fp32, compared with ``memory_breakdown(numerics=FP32)`` on the ``cpu`` GPU type:
- one process, real tensors, ``MemTracker`` (torch/distributed/_tools): recompute none / selective / full;
- FSDP2 units as the trials wrap them (``apply_dp``: the ends, each block, the root) over a fake
  process group of 4 and 8 ranks in ``FakeTensorMode`` with ``FSDPMemTracker``: fsdp-full and
  fsdp-grad-op; one process, nothing allocated; and at Llama 3 8B's width and vocabulary (``wide_cases``),
  where the ends' units decide the peak.
The CPU runs the eager, decomposed RMSNorm, so the model is asked with ``Kernels(fused_norm=False)``.

GPU (``--gpu``, one CUDA device), bf16 autocast as the trials run at DP=1: ``torch.cuda.max_memory_allocated``
against ``memory_breakdown(numerics=MIXED_BF16)`` without its reserve; plus the CUDA context (device memory
in use outside the caching allocator) and the allocator's reserved/allocated slack, which ground the
reserve constants.

Usage: python benchmarks/memory_crosscheck.py [--gpu] [--tiny] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.catalog import make_cluster
from autotune.costmodel.activations import Kernels
from autotune.costmodel.memory import MemoryBreakdown, memory_breakdown
from autotune.costmodel.states import FP32, Numerics
from autotune.plan import ParallelPlan, Recompute, Sharding
from autotune.specs import ModelSpec
from autotune.trials.model import Transformer
from autotune.trials.parallelize import apply_ac, apply_dp
from benchmarks._crosscheck_models import ACCUMULATION, GPU_MODEL_8B, WIDE_WORLD, cpu_setup
from benchmarks._crosscheck_report import markdown, pct

_MIB = 1024**2


@dataclass(frozen=True)
class Case:
    name: str
    spec: ModelSpec
    plan: ParallelPlan


def cpu_cases(spec: ModelSpec, *, micro_batch: int, seq_len: int, worlds: tuple[int, ...]) -> list[Case]:
    cases = [
        Case(
            f"1 rank, recompute {rc}",
            spec,
            ParallelPlan(
                micro_batch=micro_batch,
                global_batch=micro_batch * ACCUMULATION,
                seq_len=seq_len,
                recompute=rc,
            ),
        )
        for rc in ("none", "selective", "full")
    ]
    for world in worlds:
        for sharding in ("fsdp-full", "fsdp-grad-op"):
            cases.append(
                Case(
                    f"{sharding}, {world} ranks (fake PG)",
                    spec,
                    ParallelPlan(
                        dp=world,
                        micro_batch=micro_batch,
                        global_batch=micro_batch * world * ACCUMULATION,
                        seq_len=seq_len,
                        sharding=sharding,
                    ),
                )
            )
    return cases


def _train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    spec: ModelSpec,
    plan: ParallelPlan,
    device: str,
    autocast: bool,
    after=None,
) -> None:
    """One optimizer step of ``ACCUMULATION`` micro-batches; ``after(phase)`` runs after each micro-batch's
    backward (``"microbatch"``) and after the optimizer step (``"step"``)."""
    for _ in range(ACCUMULATION):
        ids = torch.randint(spec.vocab_size, (plan.micro_batch, plan.seq_len), device=device)
        ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx:
            logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())  # autotune.trials.train.lm_loss
        del logits
        loss.backward()
        if after is not None:
            after("microbatch")
    opt.step()
    if after is not None:
        after("step")
    opt.zero_grad()


def _adamw(model: torch.nn.Module, foreach: bool = True) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)  # as autotune/trials/train.py


def _reset(tracker):
    """MemTracker refuses a module's second forward in one context without ``reset_mod_stats``."""
    return lambda _phase: tracker.reset_mod_stats()


def measure_one_rank(case: Case) -> dict[str, float]:
    """Peak bytes by MemTracker category, fp32, real tensors."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = Transformer(case.spec)
    if case.plan.recompute is not Recompute.NONE:
        apply_ac(model, case.plan.recompute)
    opt = _adamw(model)
    _train_step(model, opt, case.spec, case.plan, "cpu", False)  # creates the optimizer states
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        _train_step(model, opt, case.spec, case.plan, "cpu", False, _reset(tracker))
    return _categories(tracker.get_tracker_snapshot("peak"))


def measure_fsdp(case: Case) -> dict[str, float]:
    """Per-rank peak of FSDP2 over a fake process group, by FSDPMemTracker category (nothing allocated)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = case.plan.dp
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
        with FakeTensorMode():
            model = Transformer(case.spec)
            if case.plan.recompute is not Recompute.NONE:  # AC then DP, as the trials parallelize
                apply_ac(model, case.plan.recompute)
            apply_dp(model, mesh, plan=case.plan, mp_policy=MixedPrecisionPolicy())  # the trials' units
            opt = _adamw(model)
            tracker = FSDPMemTracker(model, opt)
            with tracker:
                for _ in range(2):
                    _train_step(model, opt, case.spec, case.plan, "cpu", False, _reset(tracker))
            return _categories(tracker.get_tracker_snapshot("peak"))
    finally:
        dist.destroy_process_group()


def _categories(snapshot: dict) -> dict[str, float]:
    (per_device,) = snapshot.values()
    return {str(getattr(k, "name", k)): float(v) for k, v in per_device.items()}


_STATE_KEYS = ("PARAM", "BUFFER", "GRAD", "OPT", "SHARDED_PARAM", "SHARDED_GRAD")


def measured_groups(measured: dict[str, float], plan: ParallelPlan) -> dict[str, float]:
    """Measured peak split like the model's groups: model states vs what comes and goes."""
    states = sum(measured.get(k, 0.0) for k in _STATE_KEYS)
    if plan.sharding is Sharding.FSDP_GRAD_OP:  # the model counts the gathered copy as weights
        states += measured.get("UNSHARDED_PARAM", 0.0)
    return {"states": states, "transient": measured["Total"] - states, "total": measured["Total"]}


def predicted_groups(mem: MemoryBreakdown) -> dict[str, float]:
    states = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
    total = mem.total_bytes - mem.reserve_bytes
    return {"states": states, "transient": total - states, "total": total}


def predict(case: Case, numerics: Numerics, kernels: Kernels, gpu: str = "cpu") -> MemoryBreakdown:
    cluster = make_cluster(num_gpus=case.plan.world_size, gpu=gpu, gpus_per_node=case.plan.world_size)
    return memory_breakdown(case.spec, cluster, case.plan, numerics=numerics, kernels=kernels)


def compare(case: Case, measured: dict[str, float], mem: MemoryBreakdown) -> dict[str, object]:
    got, want = predicted_groups(mem), measured_groups(measured, case.plan)
    row: dict[str, object] = {
        "case": case.name,
        "plan": case.plan.to_dict(),
        "measured": measured,
        "predicted": mem.as_dict(),
    }
    for key in ("states", "transient", "total"):
        row[f"{key}_measured_mib"] = want[key] / _MIB
        row[f"{key}_predicted_mib"] = got[key] / _MIB
        row[f"{key}_rel_error"] = (got[key] - want[key]) / want[key] if want[key] else 0.0
    return row


def wide_cases() -> list[Case]:
    """FSDP2 at Llama 3 8B's width and vocabulary (``GPU_MODEL_8B``: 4 layers, each end unit 2.4x a block)
    and its tied variant, where the end units' buffers decide the peak: fsdp-full and fsdp-grad-op,
    recompute none and full, 1k and 4k tokens, over a fake process group (nothing is allocated)."""
    cases = []
    for spec in (
        GPU_MODEL_8B,
        dataclasses.replace(GPU_MODEL_8B, name=f"{GPU_MODEL_8B.name}-tied", tie_embeddings=True),
    ):
        for sharding in ("fsdp-full", "fsdp-grad-op"):
            for recompute in ("none", "full"):
                for seq in (1024, 4096):
                    plan = ParallelPlan(
                        dp=WIDE_WORLD,
                        micro_batch=1,
                        global_batch=WIDE_WORLD * ACCUMULATION,
                        seq_len=seq,
                        sharding=sharding,
                        recompute=recompute,
                    )
                    cases.append(
                        Case(f"{spec.name}, {sharding}, recompute {recompute}, {seq} tokens", spec, plan)
                    )
    return cases


def run_cpu(*, tiny: bool) -> list[dict[str, object]]:
    spec, mb, seq, worlds = cpu_setup(tiny)
    kernels = Kernels(fused_norm=False)  # eager F.rms_norm on CPU stores x * rstd too
    cases = cpu_cases(spec, micro_batch=mb, seq_len=seq, worlds=worlds)
    rows = []
    if not tiny:
        # the first fake-mode step of each model books a one-off spike in the OPT category (at 8B width
        # ~13x the optimizer states): one run of each before the measured ones
        for spec_ in {c.spec.name: c for c in wide_cases()}.values():
            measure_fsdp(spec_)
        cases += wide_cases()
    for case in cases:
        measured = measure_fsdp(case) if case.plan.dp > 1 else measure_one_rank(case)
        rows.append(compare(case, measured, predict(case, FP32, kernels)))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true", help="measure on the CUDA device instead of the CPU")
    p.add_argument("--tiny", action="store_true", help="the small, fast CPU variant the test runs")
    p.add_argument(
        "--gpu-model",
        choices=("1b", "8b", "8b-fp8"),
        default="1b",
        help="with --gpu: the 1B-class model (memory_crosscheck_gpu.json) or Llama 3 8B's width at 8k "
        "tokens, 4 layers (memory_crosscheck_gpu_8b.json), or that model with torchao float8 linears "
        "(memory_crosscheck_gpu_8b_fp8.json; needs torchao, the test extra)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu_json = args.out / "memory_crosscheck_gpu.json"
    if args.gpu:
        from benchmarks.memory_crosscheck_gpu import run_gpu  # imports this module: not at the top

        result = run_gpu(args.gpu_model)
        if args.gpu_model != "1b":
            gpu_json = args.out / f"memory_crosscheck_gpu_{args.gpu_model.replace('-', '_')}.json"
        gpu_json.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
        for r in result["rows"]:
            print(
                f"{r['case']}: measured {r['total_measured_mib']:.0f} MiB, predicted "
                f"{r['total_predicted_mib']:.0f} MiB ({pct(r['total_rel_error'])}); phases "
                + ", ".join(f"{n} {v:.0f}" for n, v in r["phases_mib"])
            )
        return 0
    rows = run_cpu(tiny=args.tiny)
    payload = {"host": platform.platform(), "torch": torch.__version__, "rows": rows}
    (args.out / "memory_crosscheck.json").write_text(json.dumps(payload, indent=1) + "\n")
    gpu = json.loads(gpu_json.read_text()) if gpu_json.exists() else None
    json_8b = args.out / "memory_crosscheck_gpu_8b.json"
    gpu_8b = json.loads(json_8b.read_text()) if json_8b.exists() else None
    (args.out / "memory_crosscheck.md").write_text(markdown(rows, gpu, tiny=args.tiny, gpu_8b=gpu_8b))
    for r in rows:
        print(
            f"{r['case']}: measured {r['total_measured_mib']:.1f} MiB, predicted "
            f"{r['total_predicted_mib']:.1f} MiB ({pct(r['total_rel_error'])})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
