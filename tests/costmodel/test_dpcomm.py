"""Tier 1: which DP collectives each framework issues for each sharding (dpcomm.py)."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import comm
from autotune.costmodel.dpcomm import GRAD_REDUCE_BYTES, PARAM_GATHER_BYTES, collective_calls, dp_comm_s
from autotune.plan import ParallelPlan


@pytest.mark.parametrize("sharding", ["zero1", "zero2"])
def test_deepspeed_all_reduces_its_gradient_buckets_megatron_reduce_scatters(sharding):
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    params = model.num_params
    link = comm.group_link(cluster, 8, 1)
    others = [("megatron", comm.reduce_scatter_s)] if sharding == "zero1" else []  # Megatron has no ZeRO-2
    for framework, grads in [("deepspeed", comm.allreduce_s), *others]:
        plan = ParallelPlan(dp=8, global_batch=16, micro_batch=1, seq_len=2048, sharding=sharding,
                            framework=framework)
        gathers, reduces = collective_calls(model, plan, params, model.num_layers)
        grads_s = grads(params * GRAD_REDUCE_BYTES[framework], 8, link, reduces)
        params_s = comm.allgather_s(params * PARAM_GATHER_BYTES, 8, link, gathers)
        dp = dp_comm_s(cluster, model, plan, params, model.num_layers)
        if sharding == "zero1":
            assert dp.once_s == pytest.approx(grads_s + params_s) and dp.per_microbatch_s == 0
        else:  # ZeRO-2 reduces in every micro-batch's backward
            assert dp.per_microbatch_s == pytest.approx(grads_s) and dp.once_s == pytest.approx(params_s)
