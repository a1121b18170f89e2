"""torchtitan 0.2.2's own start-up on the plans the search finds: a fixed-seed sample of the feasible
framework-fsdp plans of several models (dense, MoE, MLA, long context, uneven pipelines, fp8), each emitted
by ``emit_all`` and its ``torchtitan.toml`` taken through what torchtitan's ``Trainer.__init__`` does before
it touches a device: ``ConfigManager`` parses the file, ``ParallelDims`` builds every mesh, the model of the
named flavor is built on the meta device, the model converters (float8, MX) convert it, the batch sizes are
checked as the trainer asserts them, and the model's ``pipelining_fn`` (stages, split, schedule) or
``parallelize_fn`` (TP, activation checkpointing, compile, FSDP, EP) applies the parallelism.

One process plays rank 0 of the plan's world on torch's ``fake`` process-group backend (collectives are
no-ops; the meshes and shardings are real), with the CPU as device type; ``has_cuda_capability`` answers as
the plan's GPU would (9.0 Hopper, 10.0 Blackwell), which float8, MXFP8 and DeepSeek-V3's grouped GEMM ask.
The ``test`` extra installs torchtitan 0.2.2:

    python benchmarks/torchtitan_validate_sampled.py --out benchmarks/results/torchtitan_validate_sampled
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.costmodel.stagestates import stage_states  # noqa: E402
from autotune.costmodel.states import MIXED_BF16, state_bytes_per_param  # noqa: E402
from autotune.emit import emit_all, torchtitan_unsupported  # noqa: E402
from autotune.emit.torchtitan import torchtitan_model_unsupported  # noqa: E402
from autotune.plan import Framework, ParallelPlan  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402
from benchmarks._sampled_plans import (  # noqa: E402
    fields,
    option_variants,
    run_children,
    sample_plans,
    summary,
    write_results,
)

_FP8 = {"precision": ("fp8",), "fp8_recipe": ("tensorwise", "rowwise")}
CASES = (  # model, GPUs, GPU, sequence length, knobs that replace search_spaces/fsdp.yaml's
    ("llama3-8b", 8, "h100-sxm", 8192, {}),
    ("llama3-70b", 64, "h100-sxm", 8192, {}),
    ("llama3-70b", 128, "h100-sxm", 32768, {}),
    ("llama3-405b", 512, "h100-sxm", 8192, {}),
    ("qwen3-30b-a3b", 16, "h100-sxm", 4096, {}),
    ("qwen3-235b-a22b", 64, "b200", 4096, {}),
    ("deepseek-v3", 256, "h100-sxm", 4096, {}),
    ("llama3-8b", 8, "h100-sxm", 8192, _FP8),
    ("llama3-70b", 64, "h100-sxm", 8192, _FP8),
    ("deepseek-v3", 256, "h100-sxm", 4096, _FP8),
)
OPTIONS: dict[str, dict] = {  # plan fields the bundled fsdp space does not search, set where legal
    "torch.compile": {"compile": True},
    "async TP": {"compile": True, "async_tp": True},
    "compiled fused loss": {"compile": True, "loss_kernel": "fused"},
    "full recompute": {"recompute": "full"},
    "selective (op) recompute": {"recompute": "selective"},
    "fsdp-grad-op (no reshard)": {"sharding": "fsdp-grad-op"},
    "CP all-gather": {"cp_comm": "allgather"},
    "fp8 tensorwise": {"precision": "fp8", "fp8_recipe": "tensorwise"},
    "fp8 rowwise": {"precision": "fp8", "fp8_recipe": "rowwise"},
    "DeepEP": {"moe_dispatcher": "deepep"},
}
_CHILD = """
import json, os, sys, tempfile
import torch
import torch.distributed as dist
import torchtitan.tools.utils as U
import torchtitan.distributed.parallel_dims as PD
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore
from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
from torchtitan.protocols import train_spec as TS
from torchtitan.protocols.model_converter import build_model_converters
U.device_type = PD.device_type = "cpu"  # the meshes' device type: no GPU here
import torchtitan.components.quantization.float8 as F8
import torchtitan.components.quantization.mx as MX
import torchtitan.models.deepseek_v3.model.args as DSA
ARCH = [(9, 0)]
for module in (U, F8, MX, DSA):  # each imported has_cuda_capability by name
    module.has_cuda_capability = lambda major, minor: (major, minor) <= ARCH[0]

def start(toml, world):
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(toml)
        f.flush()
        job = ConfigManager().parse_args(["--job.config_file", f.name])
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    p = job.parallelism
    dims = PD.ParallelDims(
        dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world)
    batch = dims.get_mesh("batch").size() if dims.dp_enabled else 1
    spec = TS.get_train_spec(job.model.name)
    args = spec.model_args[job.model.flavor]
    args.update_from_config(job)
    with torch.device("meta"), U.set_default_dtype(TORCH_DTYPE_MAP[job.training.dtype]):
        model = spec.model_cls(args)
    build_model_converters(job, dims).convert(model)
    loss = spec.build_loss_fn(job, parallel_dims=dims)
    t = job.training
    assert t.global_batch_size % (t.local_batch_size * batch) == 0, "global batch % (local x DP) != 0"
    if dims.pp_enabled:
        if not spec.pipelining_fn:  # as train.py raises it
            name = job.model.name
            raise RuntimeError(f"Pipeline Parallel is enabled but {name} does not support pipelining")
        parts = spec.pipelining_fn(model, dims, job, torch.device("cpu"), args, spec.parallelize_fn, loss)[1]
    else:
        parts = [spec.parallelize_fn(model, dims, job)]
    local = [p.to_local() if isinstance(p, DTensor) else p for m in parts for p in m.parameters()]
    return sum(p.numel() for p in local)  # what rank 0 keeps: its stages' shards

for job in json.loads(sys.stdin.read()):
    try:
        ARCH[0] = tuple(job["arch"])
        out = {"ok": True, "rank0_params": start(job["toml"], job["world"])}
    except ImportError as e:  # a kernel library torchtitan imports where it applies it (DeepEP)
        out = {"ok": None, "error": f"ImportError: {e}"[:400]}
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
    print("RESULT " + json.dumps({"id": job["id"], **out}), flush=True)
"""


def _unsupported(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    return torchtitan_unsupported(plan) + torchtitan_model_unsupported(model, plan)


def rank0_params(model: ModelSpec, plan: ParallelPlan) -> float:
    """The parameters autotune's memory model puts on rank 0 (pipeline stage 0, every virtual chunk of it):
    its weight bytes (``costmodel.stagestates``) over the stored bytes per parameter, the unsharded copy
    left out."""
    _, params, states = stage_states(model, plan, MIXED_BF16, rank=0)
    per = state_bytes_per_param(plan, MIXED_BF16)
    return (states.weights_bytes - params * per.unsharded_copy) / per.weight


def _job(i: int, case: str, gpu: str, plan: ParallelPlan) -> dict:
    name, cluster = case.split(" on ")[0], make_cluster(num_gpus=plan.world_size, gpu=gpu)
    with tempfile.TemporaryDirectory() as tmp:
        emit_all(plan, load_model(name), cluster, None, tmp)
        toml = (Path(tmp) / "torchtitan.toml").read_text()
    major, minor = divmod(round(10 * (cluster.gpu.compute_capability or 9.0)), 10)  # the catalog's, e.g. 10.0
    return {"id": i, "toml": toml, "world": plan.world_size, "arch": (major, minor)}


def run(per_case: int, seed: int) -> list[dict]:
    plans = sample_plans(CASES, "fsdp", Framework.FSDP, _unsupported, per_case, seed)
    plans += option_variants(plans, OPTIONS, _unsupported)
    jobs = [_job(i, case, gpu, p) for i, (case, gpu, p) in enumerate(plans)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "LOCAL_RANK": "0"}
    results = run_children(_CHILD, jobs, env)
    rows = []
    for i, (case, _, p) in enumerate(plans):
        row = {"case": case, "plan": fields(p), **{k: v for k, v in results[i].items() if k != "id"}}
        if "rank0_params" in row:
            row["autotune_rank0_params"] = rank0_params(load_model(case.split(" on ")[0]), p)
        rows.append(row)
    return rows


def params_summary(rows: list[dict]) -> str:
    """How far autotune's rank-0 parameters (``rank0_params``) are from what torchtitan left on rank 0."""
    errors = sorted(
        (r["autotune_rank0_params"] / r["rank0_params"] - 1, r["case"]) for r in rows if r.get("rank0_params")
    )
    if not errors:
        return ""
    worst = max(errors, key=lambda e: abs(e[0]))
    within = sum(abs(e) <= 0.002 for e, _ in errors)
    return (
        f"\nParameters on rank 0 (its stages' shards, after `parallelize_fn` / `pipelining_fn`) against "
        f"autotune's memory model (`rank0_params`): {within} of {len(errors)} plans within 0.2 %, the "
        f"largest difference {worst[0]:+.2%} ({worst[1]}).\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-case", type=int, default=16, help="plans drawn per case beyond the best 8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    args = p.parse_args()
    import torchtitan  # the test extra's 0.2.2

    rows = run(args.per_case, args.seed)
    what = f"`python benchmarks/torchtitan_validate_sampled.py` (torchtitan {torchtitan.__version__})"
    text = summary(rows, "Sampled search plans through torchtitan's own start-up", what, "framework-fsdp")
    text += params_summary(rows)
    print(text)
    if args.out:
        write_results(args.out, text, rows, {"torchtitan": torchtitan.__version__, "seed": args.seed})
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
