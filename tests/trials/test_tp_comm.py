"""Tier 2: the cost model counts the TP and DP collectives the trials really issue (2 gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.dpcomm import collective_calls as dp_calls
from autotune.costmodel.dpcomm import zero3_gathers
from autotune.costmodel.hostops import TP_BLOCK_OPS, TP_EDGE_OPS
from autotune.costmodel.tpcomm import collective_calls, sp_norm_grads
from autotune.plan import ParallelPlan

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.dist(timeout=120)  # each test runs torchrun with 2 gloo ranks (30-70 s)


def _count(kind: str, out: Path, nproc: int = 2) -> dict:
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        TORCH_EXTENSIONS_DIR=str(ROOT / ".torch_extensions"),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(Path(__file__).with_name("_count_comm.py")),
        kind,
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_cost_model_counts_the_tp_collectives_of_the_trials(tmp_path):
    measured = _count("tp", tmp_path / "counts.json")
    spec = load_model("tiny")
    layouts = {"torch": {}, "torch-sp": {"sequence_parallel": True}, "deepspeed": {"framework": "deepspeed"}}
    for name, extra in layouts.items():
        plan = ParallelPlan(tp=2, global_batch=2, micro_batch=2, seq_len=64, **extra)
        assert list(collective_calls(spec, plan)) == measured[name], name
    # the torchtitan-style plan reduces each sub-layer's input gradient once, DeepSpeed AutoTP per projection
    assert measured["torch"][1] < measured["deepspeed"][1]
    # SP's partial norm gradients: one coalesced all-reduce (tpcomm.sp_norm_grads), none left to AdamW
    sp = ParallelPlan(tp=2, global_batch=2, micro_batch=2, seq_len=64, sequence_parallel=True)
    cluster = make_cluster(num_gpus=2, gpu="cpu")
    assert sp_norm_grads(spec, cluster, sp, spec.num_layers, True)[0] > 0
    assert measured["torch-sp-step"] == {"reduce": {"allreduce": 1}, "optimizer": {}}


def test_cost_model_counts_the_dp_collectives_of_the_trials(tmp_path):
    measured = _count("dp", tmp_path / "counts.json")
    spec = load_model("tiny")
    plan = ParallelPlan(dp=2, global_batch=4, micro_batch=1, seq_len=64)  # 2 micro-batches per rank
    gathers, reduces = dp_calls(spec, plan, spec.num_params, spec.num_layers)
    assert measured["fsdp-none-m2"] == {"allreduce": 2 * reduces}  # replicate: every micro-batch
    full = plan.replace(sharding="fsdp-full")
    gathers, reduces = dp_calls(spec, full, spec.num_params, spec.num_layers)
    assert measured["fsdp-full-m2"] == {"allgather": 2 * 2 * gathers, "reduce_scatter": 2 * reduces}
    # DeepSpeed ZeRO-1 all-reduces its gradient buckets (dpcomm.DEEPSPEED_BUCKET_ALLREDUCE), then all-gathers
    zero1 = measured["deepspeed-zero1-m1"]
    assert zero1.get("allreduce", 0) >= 1 and zero1.get("allgather") == 1 and "reduce_scatter" not in zero1
    # ZeRO-3: each persistent parameter once per step, the others in one coalesced fetch per micro-batch
    # (dpcomm.zero3_gathers); tiny fetches its embedding and head, small also its MLP matrices
    for name, model, micro_batches in (
        ("deepspeed-zero3-m1", "tiny", 1),
        ("deepspeed-zero3-m2", "tiny", 2),
        ("deepspeed-zero3-m2-small", "small", 2),
    ):
        g = zero3_gathers(load_model(model), 1)
        assert measured[name]["allgather"] == g.persistent + micro_batches * g.fetch_calls, name
        assert measured[name]["reduce_scatter"] == micro_batches, name
    assert zero3_gathers(load_model("small"), 1).persistent > zero3_gathers(spec, 1).persistent


def test_cost_model_counts_the_tp_x_dp_collectives_of_the_trials(tmp_path):
    """4 ranks, TP 2 x DP 2. DeepSpeed ZeRO-3: split over TP the embedding and head of ``tiny`` (65536
    elements each) would be under DeepSpeed's persistence threshold; AutoTP keeps them whole, so ZeRO-3
    fetches them. FSDP2 with SP: one all-reduce per partial norm gradient and micro-batch."""
    measured = _count("tp-dp", tmp_path / "counts.json", nproc=4)
    spec = load_model("tiny")
    g = zero3_gathers(spec, 2)
    assert g.fetched_params == 2 * spec.vocab_size * spec.hidden_size and g.fetch_calls == 1
    assert measured["deepspeed-tp2-zero3-m1"]["allgather"] == g.persistent + g.fetch_calls
    plan = ParallelPlan(
        tp=2, dp=2, global_batch=4, micro_batch=1, seq_len=64, sequence_parallel=True, sharding="fsdp-full"
    )
    calls = sp_norm_grads(spec, make_cluster(num_gpus=4, gpu="cpu"), plan, spec.num_layers, True)[1]
    assert measured["fsdp-tp2-sp-m2"]["all_reduce"] == calls == 2 * (2 * spec.num_layers + 1)


def test_cost_model_counts_the_dtensor_operators_of_torch_tp(tmp_path):
    measured = _count("host", tmp_path / "ops.json")
    for gated, name in ((True, "llama"), (False, "gpt")):
        for sp, suffix in ((False, ""), (True, "-sp")):
            assert list(TP_BLOCK_OPS[gated, sp]) == measured[name + suffix]["block"], name + suffix
            assert list(TP_EDGE_OPS[gated, sp]) == measured[name + suffix]["edge"], name + suffix
    # sequence parallelism moves the norms and the residual stream onto DTensors
    assert sum(TP_BLOCK_OPS[True, True][1::2]) > sum(TP_BLOCK_OPS[True, False][1::2])
