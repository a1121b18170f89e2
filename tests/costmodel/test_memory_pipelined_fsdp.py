"""PP + FSDP2 memory: torch pipelining defers FSDP2's gradient reduction to the last backward, so a stage
holds its parameters gathered and its fp32 gradients unsharded (``deferred_reduce_bytes``) -- pinned to the
installed torch's source and measured on autotune's own pp2 x dp2 trial stages (gloo)."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import states as states_mod
from autotune.costmodel.deferredreduce import KeptBytes, deferred_reduce_bytes
from autotune.costmodel.inflight import in_flight_microbatches
from autotune.costmodel.memory import stage_memory
from autotune.costmodel.states import model_state_bytes
from autotune.plan import ParallelPlan


def test_torch_pipelining_defers_the_fsdp_reduction_in_its_source():
    """Tier-0 pin of the installed torch (``test_pipelined_fsdp_keeps_the_stage_unsharded_as_torch_does``
    measures the effect): torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync`` and
    ``perform_reduce_grad``, FSDP2's ``FSDPParam.to_accumulated_grad_if_needed`` (upcast to reduce_dtype)."""
    import inspect

    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torch.distributed.pipelining.stage import _PipelineStageBase as Stage

    nosync = inspect.getsource(Stage.backward_maybe_with_nosync)
    reduce = inspect.getsource(Stage.perform_reduce_grad)
    for setter in ("set_reshard_after_backward", "set_requires_gradient_sync", "set_is_last_backward"):
        assert f"{setter}(False)" in nosync and f"{setter}(True)" in reduce
    upcast = inspect.getsource(FSDPParam.to_accumulated_grad_if_needed)
    assert "self.unsharded_accumulated_grad = unsharded_grad.to(self.reduce_dtype)" in upcast


def test_pipelined_fsdp_memory_counts_the_unsharded_stage():
    """PP + FSDP2 (``deferred_reduce_bytes``): the peak holds the stage's bf16 parameters (fsdp-full, hsdp;
    fsdp-grad-op counts its gathered copy with the weights) and its fp32 gradients, unsharded; nothing changes
    without PP or for other frameworks."""
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    common = {"pp": 2, "dp": 4, "global_batch": 64, "seq_len": 4096, "recompute": "full"}
    stage = states_mod.stage_params_per_gpu(model, ParallelPlan(**common), first=False, last=True)
    for sharding, params_bytes in (("fsdp-full", 2 * stage), ("hsdp", 2 * stage), ("fsdp-grad-op", 0.0)):
        hsdp = {"hsdp_shard_size": 2} if sharding == "hsdp" else {}
        plan = ParallelPlan(sharding=sharding, **hsdp, **common)
        sharded = model_state_bytes(stage, plan).gradients_bytes
        kept = deferred_reduce_bytes(model, plan, first=False, last=True, sharded_grad_bytes=sharded)
        assert kept.params_bytes == params_bytes and kept.grads_bytes + sharded == pytest.approx(4 * stage)
        mem = stage_memory(model, cluster, plan, rank=1)
        assert mem.prefetch_bytes >= kept.params_bytes + kept.grads_bytes, sharding
    shape = {"global_batch": 64, "seq_len": 4096}
    for plan in (
        ParallelPlan(dp=8, sharding="fsdp-full", **shape),
        ParallelPlan(pp=2, dp=4, sharding="zero1", framework="megatron", **shape),
        ParallelPlan(pp=2, dp=4, **shape),
    ):  # replicate: its gradients are whole anyway
        kept = deferred_reduce_bytes(model, plan, first=True, last=True, sharded_grad_bytes=0.0)
        assert kept == KeptBytes()


# --------------------------------------------------------------------------- pipelining + FSDP2 (torch 2.13)
PP_FSDP_CASES = {
    "fsdp-full/1f1b": {"sharding": "fsdp-full"},
    "fsdp-full/gpipe": {"sharding": "fsdp-full", "schedule": "gpipe"},
    "fsdp-grad-op/1f1b": {"sharding": "fsdp-grad-op"},
}


def _pp_fsdp_plan(fields: dict[str, str]) -> ParallelPlan:
    return ParallelPlan(pp=2, dp=2, global_batch=8, seq_len=16, **fields)  # 4 micro-batches per stage


def _fsdp_snapshot(root, blocks) -> dict[str, object]:
    """FSDP2 state of a stage as a block's forward starts: which block units are gathered, and the bytes of
    the gathered compute copies and of the unsharded accumulated gradients over all units (the blocks, the
    stage's end unit, the root)."""
    from torch.distributed.fsdp import FSDPModule

    states = {id(st): st for m in root.modules() if isinstance(m, FSDPModule) for st in [m._get_fsdp_state()]}
    groups = [g for st in states.values() for g in st._fsdp_param_groups]
    acc = [
        fp.unsharded_accumulated_grad
        for g in groups
        for fp in g.fsdp_params
        if fp.unsharded_accumulated_grad is not None
    ]
    return {
        "blocks_gathered": [b._get_fsdp_state()._fsdp_param_groups[0].is_unsharded for b in blocks],
        "gathered_bytes": sum(
            fp._orig_size.numel() * fp.param_dtype.itemsize
            for g in groups
            if g.is_unsharded
            for fp in g.fsdp_params
        ),
        "acc_bytes": sum(t.numel() * t.element_size() for t in acc),
        "acc_dtypes": sorted({str(t.dtype) for t in acc}),
        "sharded_grads": any(p.grad is not None for p in root.parameters()),
    }


def _counted(collective, name: str, calls: Counter):
    """``collective`` that first counts a call per FSDP unit (keyed by its first ``FSDPParam``)."""

    def wrapper(fsdp_params, *args, **kwargs):
        calls[name, id(fsdp_params[0])] += 1
        return collective(fsdp_params, *args, **kwargs)

    return wrapper


def _pp_fsdp_probe(rank: int, world_size: int, cases: dict[str, dict[str, str]]) -> dict[str, object]:
    """One pp2 x dp2 trial stage per case (``_probe_stage``), FSDP2's collectives counted per unit."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg

    calls: Counter = Counter()
    for name in ("foreach_all_gather", "foreach_reduce"):
        setattr(pg, name, _counted(getattr(pg, name), name, calls))
    return {case: _probe_stage(_pp_fsdp_plan(fields), calls) for case, fields in cases.items()}


def _probe_stage(plan: ParallelPlan, calls: Counter) -> dict[str, object]:
    """A stage built as autotune/trials/train.py builds it (bf16 params, fp32 reduce), stepped twice
    (torch's first step adds a shape-inference forward/backward); the second step is recorded."""
    import torch

    from autotune.trials.model import build_model
    from autotune.trials.parallelize import build_mesh, build_schedule, parallelize, split_stages
    from autotune.trials.train import lm_loss

    mesh = build_mesh(plan, "cpu")
    ((stage, chunk),) = split_stages(
        build_model(load_model("tiny"), device="cpu", seed=0), plan=plan, pp_rank=mesh.get_local_rank("pp")
    )
    root = parallelize(chunk, plan=plan, mesh=mesh, param_dtype=torch.bfloat16)
    schedule = build_schedule(
        [(stage, root)], plan=plan, mesh=mesh, device=torch.device("cpu"), loss_fn=lm_loss
    )
    blocks = list(root.layers.values())
    seen: list[dict[str, object]] = []
    blocks[0].register_forward_pre_hook(lambda *_: seen.append(_fsdp_snapshot(root, blocks)), prepend=True)
    tokens = torch.randint(0, 1024, (2, 4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        calls.clear()
        seen.clear()
        root.zero_grad(set_to_none=True)  # as the trainer does after each optimizer step
        if stage == 0:
            schedule.step(tokens[0])
        else:
            schedule.step(target=tokens[1], losses=[])
    firsts = [id(b._get_fsdp_state()._fsdp_param_groups[0].fsdp_params[0]) for b in blocks]
    return {
        "stage": stage,
        "seen": seen,
        "numel": sum(p.numel() for p in root.parameters()),
        "gathers": [calls["foreach_all_gather", f] for f in firsts],
        "reduces": [calls["foreach_reduce", f] for f in firsts],
        "after": _fsdp_snapshot(root, blocks),
    }


def _run_pp_fsdp_probe() -> list[dict[str, object]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/distributed.py
    from distributed import run_on_ranks

    return run_on_ranks(_pp_fsdp_probe, 4, PP_FSDP_CASES, timeout_s=240)


@pytest.mark.dist(timeout=300)
@pytest.mark.slow
def test_pipelined_fsdp_keeps_the_stage_unsharded_as_torch_does():
    """torch 2.13 pipelining + FSDP2, measured on autotune's own pp2 x dp2 trial stages (gloo):
    torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync`` turns off gradient sync and
    resharding after backward, ``perform_reduce_grad`` reduces once after the last backward; FSDP2
    (fsdp/_fully_shard/_fsdp_param.py ``to_accumulated_grad_if_needed``) accumulates unsharded gradients in
    ``reduce_dtype`` fp32. A forward that follows a backward finds every unit of the stage gathered (but the
    embeddings', resharded after its own forward) and 4 B per stage parameter accumulated, as
    ``deferred_reduce_bytes`` counts at the end of a backward; the sharded gradients appear only
    after the step's reduction. Per unit and step: ``m + 1`` all-gathers (fsdp-full, any schedule), 1
    (fsdp-grad-op), 1 reduce-scatter (dpcomm ``_pipelined_fsdp_comm``)."""
    m = 4
    for rank, results in enumerate(_run_pp_fsdp_probe()):
        for case, got in results.items():
            plan = _pp_fsdp_plan(PP_FSDP_CASES[case])
            stage, seen, numel = got["stage"], got["seen"], got["numel"]
            first, last = stage == 0, stage == plan.pp - 1
            assert numel == states_mod.stage_params_per_gpu(load_model("tiny"), plan, first=first, last=last)
            sharded = model_state_bytes(numel, plan).gradients_bytes
            kept = deferred_reduce_bytes(
                load_model("tiny"), plan, first=first, last=last, sharded_grad_bytes=sharded
            )
            warmup = m if plan.schedule.value == "gpipe" else int(in_flight_microbatches(plan, rank=stage))
            assert len(seen) == m, (rank, case)
            for i, snap in enumerate(seen):  # the forwards before the first backward: nothing accumulated
                assert snap["acc_bytes"] == (0 if i < warmup else kept.grads_bytes + sharded), (rank, case, i)
                assert not snap["sharded_grads"]
            after_backward = seen[warmup:]
            assert all(all(s["blocks_gathered"]) for s in after_backward), (rank, case)
            assert all(s["acc_dtypes"] == ["torch.float32"] for s in after_backward)
            if case.startswith("fsdp-full"):  # the whole stage stays gathered from the backward on, but the
                # embeddings' unit (trials.parallelize.end_units), which has just run its forward, resharded
                embed = states_mod.root_params_per_gpu(load_model("tiny"), plan, first=first, last=False)
                assert kept.params_bytes == 2 * numel
                assert all(s["gathered_bytes"] == 2 * (numel - embed) for s in after_backward), (rank, case)
            assert got["gathers"] == [m + 1 if case.startswith("fsdp-full") else 1] * 2, (rank, case)
            assert got["reduces"] == [1, 1]
            assert got["after"]["acc_bytes"] == 0 and got["after"]["sharded_grads"]
            assert not any(got["after"]["blocks_gathered"])
