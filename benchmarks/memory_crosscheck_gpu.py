"""The GPU half of the memory cross-check (``python benchmarks/memory_crosscheck.py --gpu``): FSDP2 on one
CUDA device under bf16 autocast, allocator peaks per phase against ``memory_breakdown(numerics=MIXED_BF16)``
without its reserve, plus the CUDA context, NCCL's footprint and what the fused kernels store."""

from __future__ import annotations

import dataclasses
import gc

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autotune.costmodel.activations import Kernels
from autotune.costmodel.memory import MemoryBreakdown
from autotune.costmodel.states import MIXED_BF16
from autotune.plan import Fp8Recipe, ParallelPlan, Precision, Recompute, Sharding
from autotune.trials.model import Transformer
from autotune.trials.parallelize import apply_ac, end_units
from benchmarks._crosscheck_models import ACCUMULATION, GPU_MODEL, GPU_MODEL_8B
from benchmarks.memory_crosscheck import _MIB, Case, _adamw, _train_step, predict


def _unvalidated_plan(**fields: object) -> ParallelPlan:
    """A plan ParallelPlan refuses as a search choice: FSDP over one rank (nothing to shard). The trials'
    ``fsdp_at_dp1`` validation mode runs exactly this, and it is the only FSDP2 mixed-precision layout
    one GPU can measure; the memory model handles shard degree 1 like any other."""
    base = ParallelPlan(global_batch=1, seq_len=1)
    defaults = {f: getattr(base, f) for f in ParallelPlan.__dataclass_fields__}
    plan = object.__new__(ParallelPlan)
    for name, value in {**defaults, **fields}.items():
        object.__setattr__(plan, name, value)
    return plan


def _saved_bytes(fn, *args: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for ``fn(*args)`` (parameters excluded)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, torch.nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def gpu_kernel_facts(device: str) -> dict[str, object]:
    """Does F.rms_norm store only its input on this device (fused)? What does bf16 SDPA store?"""
    b, s, h, heads = 2, 1024, 1024, 8
    x = torch.randn(b, s, h, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = torch.nn.Parameter(torch.ones(h, device=device, dtype=torch.bfloat16))
    norm_saved = _saved_bytes(lambda t: F.rms_norm(t, (h,), w), x)
    q = torch.randn(b, heads, s, h // heads, device=device, dtype=torch.bfloat16, requires_grad=True)
    k, v = q.detach().clone().requires_grad_(), q.detach().clone().requires_grad_()
    sdpa_saved = _saved_bytes(lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), q, k, v)
    return {
        "rms_norm_saved_bytes": norm_saved,
        "rms_norm_input_bytes": x.numel() * 2,
        "rms_norm_fused": norm_saved < 1.5 * x.numel() * 2,
        "sdpa_saved_bytes": sdpa_saved,
        "sdpa_qkvo_bytes": 4 * q.numel() * 2,
        "sdpa_lse_bytes": 4 * b * heads * s,
    }


def gpu_cases_8b() -> list[Case]:
    """Llama 3 8B's width at 8192 tokens: each recompute mode at micro-batch 1, full recompute at 2 (the
    local batch of torchtitan's 8B table)."""
    layouts = [(rc, 1) for rc in ("none", "selective", "full")] + [("full", 2)]
    return [
        Case(
            f"fsdp2 1 GPU, bf16, 8B width x 4 layers, seq 8192, mbs {mb}, recompute {rc}",
            GPU_MODEL_8B,
            _unvalidated_plan(
                micro_batch=mb,
                global_batch=mb * ACCUMULATION,
                seq_len=8192,
                sharding=Sharding.FSDP_FULL,
                recompute=Recompute(rc),
            ),
        )
        for rc, mb in layouts
    ]


FP8_RECIPES = ("tensorwise", "rowwise")
"""torchao float8 recipes of the fp8 cases (``Float8LinearConfig.from_recipe_name``), torchtitan's two."""


def gpu_cases_8b_fp8() -> list[Case]:
    """The 8B-width model with torchao float8 linears (issue 21's bf16-vs-fp8 check): each recipe with no
    and with full recompute at micro-batch 1, beside the bf16 cases of ``gpu_cases_8b``."""
    return [
        Case(
            f"fsdp2 1 GPU, fp8 {recipe} (torchao), 8B width x 4 layers, seq 8192, mbs 1, recompute {rc}",
            GPU_MODEL_8B,
            _unvalidated_plan(
                micro_batch=1,
                global_batch=ACCUMULATION,
                seq_len=8192,
                sharding=Sharding.FSDP_FULL,
                recompute=Recompute(rc),
                precision=Precision.FP8,
                fp8_recipe=Fp8Recipe(recipe),
            ),
        )
        for recipe in FP8_RECIPES
        for rc in ("none", "full")
    ]


def float8_linears(model: torch.nn.Module, recipe: str, emulate: bool = False) -> torch.nn.Module:
    """Swap the blocks' linears for torchao ``Float8Linear`` as torchtitan does (torchtitan/components/
    quantization/float8.py: ``convert_to_float8_training`` with the recipe's config, the output head left in
    bf16); ``emulate`` runs the casts without fp8 GEMMs (a CPU check of the conversion)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    return convert_to_float8_training(
        model,
        config=config,
        module_filter_fn=lambda mod, fqn: (
            fqn != "lm_head" and mod.in_features % 16 == 0 and mod.out_features % 16 == 0
        ),
    )


def gpu_cases() -> list[Case]:
    spec = GPU_MODEL
    cases = [
        Case(
            f"fsdp2 1 GPU, bf16, recompute {rc}",
            spec,
            _unvalidated_plan(
                micro_batch=4,
                global_batch=4 * ACCUMULATION,
                seq_len=2048,
                sharding=Sharding.FSDP_FULL,
                recompute=Recompute(rc),
            ),
        )
        for rc in ("none", "selective", "full")
    ]
    cases.append(
        Case(
            "fsdp2 1 GPU, bf16, full recompute, short (step-bound)",
            spec,
            _unvalidated_plan(
                micro_batch=1,
                global_batch=ACCUMULATION,
                seq_len=256,
                sharding=Sharding.FSDP_FULL,
                recompute=Recompute.FULL,
            ),
        )
    )
    return cases


def measure_gpu(case: Case, mesh, foreach: bool = True) -> dict[str, object]:
    """FSDP2 (bf16 params, fp32 reduce) on a 1-rank NCCL mesh, as trials wrap it; allocator peaks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    base, base_reserved = float(torch.cuda.memory_allocated()), float(torch.cuda.memory_reserved())
    with torch.device("cuda"):
        model = Transformer(case.spec)
    if case.plan.precision is Precision.FP8:
        float8_linears(model, str(case.plan.fp8_recipe))
    if case.plan.recompute is not Recompute.NONE:
        apply_ac(model, case.plan.recompute)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in [*end_units(model), *model.layers.values()]:  # as the trials wrap it (apply_dp)
        fully_shard(unit, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = _adamw(model, foreach)
    _train_step(model, opt, case.spec, case.plan, "cuda", False)  # optimizer states exist from here on
    torch.cuda.synchronize()
    leftover = float(torch.cuda.memory_allocated()) - base - _states_bytes(model, opt)
    peaks: list[tuple[str, float]] = [("start", float(torch.cuda.memory_allocated()) - base)]
    reserved: list[float] = []
    torch.cuda.reset_peak_memory_stats()

    def after(phase: str) -> None:  # the peak of each phase, then start the next one afresh
        torch.cuda.synchronize()
        peaks.append((phase, float(torch.cuda.max_memory_allocated()) - base))  # this case's bytes only
        reserved.append(float(torch.cuda.max_memory_reserved()) - base_reserved)
        torch.cuda.reset_peak_memory_stats()

    _train_step(model, opt, case.spec, case.plan, "cuda", False, after)
    out = {
        "Total": max(v for _, v in peaks),
        "reserved": max(reserved),
        "phases_mib": [(name, v / _MIB) for name, v in peaks],
        "leftover_mib": leftover / _MIB,
    }
    del model, opt
    gc.collect()  # FSDP2's hooks hold the model in reference cycles: free it before the next case
    torch.cuda.empty_cache()
    return out


def _states_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
    """Bytes of the (sharded) parameters and optimizer states: what must be allocated between steps."""
    tensors = list(model.parameters()) + [
        t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)
    ]
    return float(sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in tensors))


def nccl_group_bytes(groups: int = 2) -> list[int]:
    """Device memory each further 1-rank group adds at its first all-reduce, as torch makes groups (split
    from the world's communicator when it was bound to a device): what ``reserve.nccl_bytes`` takes every
    communicator to cost (``NCCL_BYTES_PER_COMMUNICATOR``, from the world's)."""
    out = []
    for _ in range(groups):
        free, reserved = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
        dist.all_reduce(torch.ones(1 << 20, device="cuda"), group=dist.new_group([0]))
        torch.cuda.synchronize()
        grown = torch.cuda.memory_reserved() - reserved  # the tensor's block, if the allocator grew
        out.append(free - torch.cuda.mem_get_info()[0] - grown)
    return out


def run_gpu(model: str = "1b") -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh

    torch.cuda.init()
    (
        torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
        @ torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
    ).sum().item()
    free, total = torch.cuda.mem_get_info()
    context = total - free - torch.cuda.memory_reserved()
    dist.init_process_group(
        "nccl", rank=0, world_size=1, store=dist.HashStore(), device_id=torch.device("cuda", 0)
    )
    dist.all_reduce(torch.ones(1 << 20, device="cuda"))
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    nccl = total - free - torch.cuda.memory_reserved() - context
    groups = nccl_group_bytes()
    facts = gpu_kernel_facts("cuda")
    kernels = Kernels(fused_norm=bool(facts["rms_norm_fused"]))
    mesh = init_device_mesh("cuda", (1,))
    rows = []
    cases = {"1b": gpu_cases, "8b": gpu_cases_8b, "8b-fp8": gpu_cases_8b_fp8}[model]()
    runs = [(c, True) for c in cases] + ([(cases[-1], False)] if model == "1b" else [])
    for case, foreach in runs:
        measured = measure_gpu(case, mesh, foreach)
        numerics = dataclasses.replace(MIXED_BF16, foreach_adamw=foreach)
        row = compare_totals(case, measured, predict(case, numerics, kernels, gpu="h200"))
        if not foreach:
            row["case"] += ", AdamW foreach=False"
        row["reserved_mib"] = measured["reserved"] / _MIB
        row["phases_mib"] = measured["phases_mib"]
        row["leftover_mib"] = measured["leftover_mib"]
        rows.append(row)
    dist.destroy_process_group()
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "context_bytes": context,
        "nccl_world1_bytes": nccl,
        "nccl_next_group_bytes": groups,
        "kernel_facts": facts,
        "rows": rows,
    }


def compare_totals(case: Case, measured: dict[str, float], mem: MemoryBreakdown) -> dict[str, object]:
    predicted = mem.total_bytes - mem.reserve_bytes
    return {
        "case": case.name,
        "plan": case.plan.to_dict(),
        "predicted": mem.as_dict(),
        "total_measured_mib": measured["Total"] / _MIB,
        "total_predicted_mib": predicted / _MIB,
        "total_rel_error": (predicted - measured["Total"]) / measured["Total"],
    }
