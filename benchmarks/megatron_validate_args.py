"""Megatron-LM's own ``parse_args`` + ``validate_args`` on emitted ``megatron_args.txt``, with the launcher's
environment (``autotune_env.sh`` sourced as every launcher sources it) and a Hopper GPU patched in
(``megatron.training.arguments.get_device_arch_version`` -> 9, ``torch.cuda.get_device_capability`` -> (9, 0),
which ``--moe-grouped-gemm`` asks; there is no GPU here).

Megatron-LM's ``megatron/training`` is not on PyPI (the ``megatron-core`` wheel and sdist ship only
``megatron/core``), so CI cannot run this: point ``--megatron-lm`` at a checkout of tag ``core_v0.16.1``
and install ``megatron-core==0.16.1 six regex``. Each plan runs in a fresh interpreter (Megatron keeps global
state), once as emitted and, for TP/CP > 1, once without ``CUDA_DEVICE_MAX_CONNECTIONS`` (it must fail).

    python benchmarks/megatron_validate_args.py --megatron-lm /path/to/Megatron-LM \\
        --out benchmarks/results/megatron_validate_args.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.catalog import load_model, make_cluster
from autotune.emit import emit_all
from autotune.plan import ParallelPlan

PLANS = {  # name: (model, GPUs, plan fields); every one priced for Megatron
    "70b-tp8-pp4-interleaved-sp": (
        "70b",
        64,
        dict(
            tp=8,
            pp=4,
            dp=2,
            global_batch=512,
            seq_len=4096,
            sharding="zero1",
            sequence_parallel=True,
            recompute="selective",
            schedule="interleaved",
            virtual_stages=5,
        ),
    ),
    "gpt3-175b-tp8-pp8-full": (
        "gpt3-175b",
        64,
        dict(tp=8, pp=8, global_batch=64, seq_len=2048, recompute="full"),
    ),
    "llama3-8b-tp2-dp4-zero1": (
        "llama3-8b",
        8,
        dict(tp=2, dp=4, global_batch=64, seq_len=4096, sharding="zero1"),
    ),
    "llama3-8b-tp2-dp4-zero1-te-loss-bf16-moments": (
        "llama3-8b",
        8,
        dict(
            tp=2,
            dp=4,
            global_batch=64,
            seq_len=4096,
            sharding="zero1",
            loss_kernel="fused",
            precision_aware_optimizer=True,
            adam_dtype="bf16",
        ),
    ),
    "llama3-8b-cp2-dp4-zero1": (
        "llama3-8b",
        8,
        dict(cp=2, dp=4, global_batch=64, seq_len=8192, sharding="zero1"),
    ),
    "7b-dp8-zero1": ("7b", 8, dict(dp=8, global_batch=64, seq_len=4096, sharding="zero1")),
    # what defines the model beyond its shape (autotune.definition): RoPE scaling, Q/K norm, epsilon, MLA YaRN
    "llama3-405b-tp8-pp2-rope-scaling": (
        "llama3-405b",
        16,
        dict(tp=8, pp=2, global_batch=16, seq_len=8192, sequence_parallel=True, recompute="full"),
    ),
    "qwen3-30b-a3b-ep8-dp8-qk-norm": (
        "qwen3-30b-a3b",
        8,
        dict(dp=8, ep=8, global_batch=64, seq_len=4096, sharding="zero1"),
    ),
    "deepseek-v2-lite-ep8-dp8-pre-softmax": (
        "autotune/data/hf_configs/deepseek-v2-lite.json",
        8,
        dict(dp=8, ep=8, global_batch=64, seq_len=4096, sharding="zero1"),
    ),
    "qwen3-next-80b-a3b-ep8-dp8": (
        "qwen3-next-80b-a3b",
        8,
        dict(dp=8, ep=8, global_batch=64, seq_len=4096, sharding="zero1"),
    ),
    "nemotron-3-nano-tp2-ep8-hybrid": (
        "nemotron-3-nano-30b-a3b",
        16,
        dict(tp=2, dp=8, ep=8, global_batch=128, seq_len=8192, sharding="zero1", sequence_parallel=True),
    ),
    # TP a multiple of the KV heads: each K/V head on TP / KV ranks (modelshape.kv_replicas)
    "nemotron-3-super-tp8-ep64-kv-replicas": (
        "nemotron-3-super-120b-a12b",
        64,
        dict(tp=8, dp=8, ep=64, global_batch=64, seq_len=8192, sharding="zero1", sequence_parallel=True),
    ),
    "qwen3-30b-a3b-tp8-ep8-kv-replicas": (
        "qwen3-30b-a3b",
        16,
        dict(tp=8, dp=2, ep=8, global_batch=64, seq_len=4096, sharding="zero1", sequence_parallel=True),
    ),
    "mistral-7b-dp8-sliding-window": (
        "mistral-7b",
        8,
        dict(dp=8, global_batch=64, seq_len=8192, sharding="zero1"),
    ),
    "nemotron-4-340b-tp8-pp4-layernorm1p-relu2": (
        "autotune/data/hf_configs/nemotron-4-340b.json",
        64,
        dict(tp=8, pp=4, dp=2, global_batch=64, seq_len=4096, sharding="zero1", sequence_parallel=True),
    ),
    "deepseek-v3-ep8-dp8-mla-yarn": (
        "deepseek-v3",
        8,
        dict(dp=8, ep=8, global_batch=64, seq_len=4096, sharding="zero1"),
    ),
}
_DEFINITION = [
    "rotary_base",
    "rotary_percent",
    "use_rope_scaling",
    "rope_scaling_factor",
    "rope_type",
    "rotary_scaling_factor",
    "mscale",
    "mscale_all_dim",
    "qk_layernorm",
    "layernorm_epsilon",  # --norm-epsilon's dest (its TransformerConfig field)
    "window_size",
    "normalization",
    "layernorm_zero_centered_gamma",  # --apply-layernorm-1p's dest
    "swiglu",
    "openai_gelu",
    "squared_relu",
    "moe_router_score_function",
    "moe_router_pre_softmax",
    "moe_router_topk_scaling_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_enable_expert_bias",
    "moe_shared_expert_gate",
]
"""The arguments the model's definition sets, read back after ``validate_args``."""
_CHILD = """
import json, os, sys
from unittest import mock
sys.path.insert(0, os.environ["MEGATRON_LM"])
from megatron.training import arguments as A
argv = json.loads(os.environ["MEGATRON_ARGV"])
with mock.patch.object(sys, "argv", ["pretrain_gpt.py", *argv]):
    args = A.parse_args()
try:
    with mock.patch.object(A, "get_device_arch_version", return_value=9), \
            mock.patch.object(A.torch.cuda, "get_device_capability", return_value=(9, 0)):
        A.validate_args(args, {})
    out = {"ok": True, "data_parallel_size": args.data_parallel_size,
           "overlap_grad_reduce": args.overlap_grad_reduce, "overlap_param_gather": args.overlap_param_gather,
           "attention_dropout": args.attention_dropout, "hidden_dropout": args.hidden_dropout,
           "cross_entropy": [args.cross_entropy_loss_fusion, args.cross_entropy_fusion_impl],
           "optimizer": [args.use_precision_aware_optimizer, str(args.exp_avg_dtype),
                         str(args.exp_avg_sq_dtype)],
           "definition": {k: getattr(args, k, None) for k in json.loads(os.environ["DEFINITION"])}}
    try:  # the TransformerConfig the model is built from (its __post_init__ checks: TP against query groups);
        # Transformer Engine is not installed here, and its fused RoPE kernel's presence is all it asks of TE
        from megatron.core.models.common.embeddings import rope_utils
        with mock.patch.object(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: None):
            config = A.core_transformer_config_from_args(args)
        out["transformer_config"] = {"ok": True, "num_query_groups": config.num_query_groups}
    except (AssertionError, ValueError) as e:
        out["transformer_config"] = {"ok": False, "error": str(e)}
except AssertionError as e:
    out = {"ok": False, "error": str(e)}
print("RESULT " + json.dumps(out))
"""
_DATA_FLAGS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "10", "--lr", "1e-4"]
"""What ``megatron_args.txt`` leaves to the user (data, tokenizer, schedule), the least Megatron accepts."""


def _launch_env(best: Path) -> dict[str, str]:
    """The environment a launcher gives the script: ``autotune_env.sh`` sourced with RUN_DIR set."""
    script = f'export RUN_DIR={shlex.quote(str(best))}; . "$RUN_DIR/autotune_env.sh"; env -0'
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.decode()
    return dict(line.split("=", 1) for line in out.split("\0") if "=" in line)


def _validate(megatron_lm: Path, argv: list[str], env: dict[str, str], world: int) -> dict:
    child_env = {
        **env,
        "MEGATRON_LM": str(megatron_lm),
        "MEGATRON_ARGV": json.dumps(argv),
        "WORLD_SIZE": str(world),
        "RANK": "0",
        "PYTHONWARNINGS": "ignore",
        "DEFINITION": json.dumps(_DEFINITION),
    }
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=child_env, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "error": (done.stderr or done.stdout)[-800:]}
    return json.loads(lines[-1][len("RESULT ") :])


def run(megatron_lm: Path) -> dict:
    rows = {}
    for name, (model, gpus, fields) in PLANS.items():
        plan = ParallelPlan(**fields, framework="megatron")
        with tempfile.TemporaryDirectory() as tmp:
            emit_all(plan, load_model(model), make_cluster(num_gpus=gpus), None, tmp)
            argv = shlex.split((Path(tmp) / "megatron_args.txt").read_text()) + _DATA_FLAGS
            env = {**os.environ, **_launch_env(Path(tmp))}
        row = {
            "plan": plan.to_dict(),
            "env_sets": env.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "as_emitted": _validate(megatron_lm, argv, env, gpus),
        }
        if plan.tp > 1 or plan.cp > 1:
            bare = {k: v for k, v in env.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
            row["without_env"] = _validate(megatron_lm, argv, bare, gpus)
        rows[name] = row
        print(name, json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--megatron-lm", type=Path, required=True, help="Megatron-LM checkout (core_v0.16.1)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    if not (args.megatron_lm / "megatron" / "training" / "arguments.py").exists():
        p.error(f"--megatron-lm {args.megatron_lm}: no megatron/training/arguments.py")
    rows = run(args.megatron_lm)
    if args.out:
        args.out.write_text(
            json.dumps({"megatron_lm": "core_v0.16.1", "device_arch": 9, "plans": rows}, indent=2) + "\n"
        )
    ok = all(r["as_emitted"]["ok"] and not r.get("without_env", {"ok": False})["ok"] for r in rows.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
