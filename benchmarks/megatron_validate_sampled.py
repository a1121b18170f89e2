"""Megatron-LM's own ``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args`` on the plans
the search finds: a fixed-seed sample of the feasible Megatron plans of several models (dense, MoE, MLA, long
context, uneven pipelines; Hopper and Blackwell), each emitted by ``emit_all`` and run with the environment
its ``autotune_env.sh`` exports, as every launcher sources it.

``benchmarks/megatron_validate_args.py`` checks hand-picked plans and reads the model definition back; this
one asks whether a plan the search can recommend is one Megatron-LM refuses at start-up. Transformer Engine is
not installed here: ``megatron.core.utils.get_te_version`` answers ``--te-version`` (the checks Megatron gates
on TE's version are asked as that version would be), the device architecture as the plan's GPU (9 Hopper, 10
Blackwell). Needs a checkout of Megatron-LM ``core_v0.16.1`` and ``megatron-core==0.16.1 six regex``:

    python benchmarks/megatron_validate_sampled.py --megatron-lm /path/to/Megatron-LM \\
        --out benchmarks/results/megatron_validate_sampled
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.emit import emit_all, megatron_unsupported  # noqa: E402
from autotune.emit.megatronmodel import megatron_model_unsupported  # noqa: E402
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
from benchmarks.megatron_validate_args import _DATA_FLAGS, _launch_env  # noqa: E402

_HOPPER_FP8 = {"precision": ("fp8",), "fp8_recipe": ("tensorwise", "delayed", "blockwise")}
_BLACKWELL_FP8 = {"precision": ("fp8",), "fp8_recipe": ("tensorwise", "mx")}
CASES = (  # model, GPUs, GPU, sequence length, knobs that replace search_spaces/megatron.yaml's
    ("llama3-8b", 8, "h100-sxm", 8192, {}),
    ("llama3-70b", 64, "h100-sxm", 8192, {}),
    ("llama3-70b", 128, "h100-sxm", 32768, {}),
    ("llama3-405b", 512, "h100-sxm", 8192, {}),
    ("mixtral-8x7b", 64, "h100-sxm", 4096, {}),
    ("qwen3-30b-a3b", 16, "h100-sxm", 4096, {}),
    ("qwen3-235b-a22b", 64, "b200", 4096, {}),
    ("deepseek-v3", 256, "h100-sxm", 4096, {}),
    ("deepseek-v3", 512, "b200", 4096, {}),
    ("llama3-70b", 64, "h100-sxm", 8192, _HOPPER_FP8),
    ("qwen3-30b-a3b", 16, "h100-sxm", 4096, _HOPPER_FP8),
    ("llama3-405b", 256, "b200", 8192, _BLACKWELL_FP8),
    ("deepseek-v3", 256, "gb200", 4096, _BLACKWELL_FP8),
    ("nemotron-3-nano-30b-a3b", 16, "h100-sxm", 8192, {}),  # hybrid Mamba-2 / MoE / attention
    ("nemotron-3-super-120b-a12b", 64, "b200", 8192, {}),  # LatentMoE
    ("nemotron-4-340b", 128, "h100-sxm", 4096, {}),  # squared ReLU, LayerNorm1P
)
_CHILD = """
import json, os, sys
from unittest import mock
from packaging.version import Version
sys.path.insert(0, os.environ["MEGATRON_LM"])
from megatron.training import arguments as A
from megatron.core.models.common.embeddings import rope_utils
import megatron.core.utils as U
te = Version(os.environ["TE_VERSION"])
U.get_te_version = lambda: te  # every is_te_min_version (arguments.py, transformer_config.py) asks it
base = dict(os.environ)
for job in json.loads(sys.stdin.read()):
    os.environ.clear()
    os.environ.update({**base, **job["env"], "WORLD_SIZE": str(job["world"]), "RANK": "0"})
    try:
        with mock.patch.object(sys, "argv", ["pretrain_gpt.py", *job["argv"]]):
            args = A.parse_args()
        arch = job["arch"]
        with mock.patch.object(A, "get_device_arch_version", return_value=arch), \\
                mock.patch.object(A.torch.cuda, "get_device_capability", return_value=(arch, 0)):
            A.validate_args(args, {})
        with mock.patch.object(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None):
            A.core_transformer_config_from_args(args)
        out = {"ok": True}
    except (AssertionError, ValueError, TypeError, SystemExit) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
    print("RESULT " + json.dumps({"id": job["id"], **out}), flush=True)
"""


def _unsupported(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    return megatron_model_unsupported(model) + megatron_unsupported(plan)


OPTIONS: dict[str, dict] = {  # plan fields no bundled space searches, set on a sampled plan where legal
    "block recompute of 2 layers": {"recompute": "full", "recompute_layers": 2},
    "activation offload of 2 layers": {"offload_activation_layers": 2},
    "precision-aware optimizer, bf16 moments": {"precision_aware_optimizer": True, "adam_dtype": "bf16"},
    "bf16 gradient reduce": {"grad_reduce_dtype": "bf16"},
    "Transformer Engine's loss": {"loss_kernel": "fused"},
    "optimizer offload": {"offload": True},
    "token drop at capacity 1": {"moe_capacity_factor": 1.0, "moe_dispatcher": "alltoall"},
    "all-gather dispatcher": {"moe_dispatcher": "allgather"},
    "HybridEP dispatcher": {"moe_dispatcher": "hybridep"},
    "recompute modules": {"recompute": "selective", "recompute_modules": ("layernorm", "moe_act", "mlp")},
    "DP overlaps off": {"overlap_grad_reduce": False, "overlap_param_gather": False},
    "TP-comm overlap": {"tp_comm_overlap": True},
    "CP all-to-all": {"cp_comm": "a2a"},
}


def _job(i: int, case: str, gpu: str, plan: ParallelPlan) -> dict:
    name, gpus = case.split(" on ")[0], plan.world_size
    with tempfile.TemporaryDirectory() as tmp:
        emit_all(plan, load_model(name), make_cluster(num_gpus=gpus, gpu=gpu), None, tmp)
        argv = shlex.split((Path(tmp) / "megatron_args.txt").read_text()) + _DATA_FLAGS
        env = {k: v for k, v in _launch_env(Path(tmp)).items() if k not in os.environ or os.environ[k] != v}
    return {
        "id": i,
        "argv": argv,
        "env": env,
        "world": gpus,
        "arch": 10 if gpu.startswith(("b", "gb")) else 9,
    }


def run(megatron_lm: Path, te_version: str, per_case: int, seed: int) -> list[dict]:
    plans = sample_plans(CASES, "megatron", Framework.MEGATRON, _unsupported, per_case, seed)
    plans += option_variants(plans, OPTIONS, _unsupported)
    jobs = [_job(i, case, gpu, p) for i, (case, gpu, p) in enumerate(plans)]
    env = {
        **os.environ,
        "MEGATRON_LM": str(megatron_lm),
        "TE_VERSION": te_version,
        "PYTHONWARNINGS": "ignore",
    }
    results = run_children(_CHILD, jobs, env)
    return [
        {"case": case, "plan": fields(p), **{k: v for k, v in results[i].items() if k != "id"}}
        for i, (case, _, p) in enumerate(plans)
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM checkout (core_v0.16.1)")
    p.add_argument(
        "--te-version", default="2.10.0", help="the Transformer Engine version checks are asked as"
    )
    p.add_argument("--per-case", type=int, default=16, help="plans drawn per case beyond the best 8")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    args = p.parse_args()
    if not (args.megatron_lm / "megatron" / "training" / "arguments.py").exists():
        p.error(f"--megatron-lm {args.megatron_lm}: no megatron/training/arguments.py")
    rows = run(args.megatron_lm, args.te_version, args.per_case, args.seed)
    what = (
        "`python benchmarks/megatron_validate_sampled.py` (Megatron-LM core_v0.16.1, Transformer Engine "
        f"answered as {args.te_version})"
    )
    text = summary(rows, "Sampled search plans through Megatron-LM's validate_args", what, "Megatron")
    print(text)
    if args.out:
        meta = {"megatron_lm": "core_v0.16.1", "te_version": args.te_version, "seed": args.seed}
        write_results(args.out, text, rows, meta)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
