"""Tier 2 (gloo, 4 ranks, ``tests/distributed.py``): parallelize lays parameters out as the plan says."""

from __future__ import annotations

import dataclasses

import pytest
from distributed import run_on_ranks
from torch.distributed.fsdp import FSDPModule

from autotune.catalog import load_model
from autotune.plan import ParallelPlan
from autotune.trials.model import build_model
from autotune.trials.parallelize import build_mesh, parallelize

LAYOUTS = {
    "tp2xdp2-fsdp": {"tp": 2, "dp": 2, "sharding": "fsdp-full"},
    "hsdp-2x2": {"dp": 4, "sharding": "hsdp", "hsdp_shard_size": 2},
    "dp4-replicate": {"dp": 4},
    "dp4-fsdp-tied": {"dp": 4, "sharding": "fsdp-full"},
}


def _layouts(rank: int, world_size: int) -> dict[str, dict[str, object]]:
    out = {}
    for name, fields in LAYOUTS.items():
        plan = ParallelPlan(global_batch=8, seq_len=16, recompute="full", **fields)
        mesh = build_mesh(plan, "cpu")
        spec = load_model("tiny")
        spec = dataclasses.replace(spec, tie_embeddings=True) if name.endswith("tied") else spec
        model = parallelize(build_model(spec, device="cpu", seed=0), plan=plan, mesh=mesh)
        units: dict[int, list[str]] = {}  # FSDP2 state -> the modules it wraps together
        for n, m in model.named_modules():
            if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_group is not None:
                units.setdefault(id(m._get_fsdp_state()), []).append(n)
        q = dict(model.named_parameters())["layers.0._checkpoint_wrapped_module.self_attn.q_proj.weight"]
        out[name] = {
            "mesh": dict(zip(mesh.mesh_dim_names, mesh.shape, strict=True)),
            "placements": [str(p) for p in q.placements],
            "local": tuple(q.to_local().shape),
            "wrapped": type(model.layers["0"]).__name__,
            "units": sorted(units.values()),
        }
    return out


@pytest.mark.dist(timeout=120)
def test_placements_follow_the_plan():
    results = run_on_ranks(_layouts, 4, timeout_s=100)
    got = results[0]
    assert all(r.keys() == got.keys() for r in results)
    # FSDP shards dim 0 over dp_shard, TP shards Q's output features (dim 0) too: 128 / 2 / 2 rows.
    assert got["tp2xdp2-fsdp"]["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
    assert got["tp2xdp2-fsdp"]["placements"] == ["_S(0, 2)", "S(0)"]  # FSDP's strided shard over TP's
    assert got["tp2xdp2-fsdp"]["local"] == (32, 128)
    assert got["hsdp-2x2"]["placements"] == ["R", "S(0)"]
    assert got["hsdp-2x2"]["local"] == (64, 128)
    assert got["dp4-replicate"]["placements"] == ["R"]
    assert got["dp4-replicate"]["local"] == (128, 128)
    assert {r["hsdp-2x2"]["wrapped"] for r in results} == {"FSDPCheckpointWrapper"}


@pytest.mark.dist(timeout=120)
def test_the_ends_are_their_own_fsdp_units_as_torchtitan_wraps_them():
    """torchtitan's ``apply_fsdp_to_decoder``: the embeddings, then the final norm with the head, then each
    block; the root keeps no parameters. Tied embeddings make one unit of both ends; replication does not
    split them off."""
    got = run_on_ranks(_layouts, 4, timeout_s=100)[0]
    blocks = [[f"layers.{i}"] for i in range(load_model("tiny").num_layers)]
    assert got["tp2xdp2-fsdp"]["units"] == sorted([["embed_tokens"], ["norm", "lm_head"], *blocks])
    assert got["hsdp-2x2"]["units"] == got["tp2xdp2-fsdp"]["units"]
    assert got["dp4-fsdp-tied"]["units"] == sorted([["embed_tokens", "norm", "lm_head"], *blocks])
    assert [""] in got["dp4-replicate"]["units"]  # replicate: per block, the ends with the root
