"""Device memory outside the step's tensors: the CUDA context and one NCCL communicator per group in use."""

from autotune.catalog import make_cluster
from autotune.costmodel.reserve import CUDA_CONTEXT_BYTES, NCCL_CONTEXT_BYTES, nccl_bytes, reserve_bytes
from autotune.plan import ParallelPlan

_MOE = {"framework": "megatron", "sharding": "zero1", "global_batch": 512, "seq_len": 4096}


def test_one_gpu_has_no_communicator_and_each_group_in_use_adds_one():
    one = ParallelPlan(global_batch=8, seq_len=4096)
    assert nccl_bytes(one) == 0.0
    assert reserve_bytes(make_cluster(num_gpus=1), one) == CUDA_CONTEXT_BYTES
    dp = ParallelPlan(dp=64, global_batch=512, seq_len=4096)
    assert nccl_bytes(dp) == 2 * NCCL_CONTEXT_BYTES  # the world and DP
    tp_pp_dp = ParallelPlan(tp=8, pp=2, dp=4, global_batch=512, seq_len=4096)
    assert nccl_bytes(tp_pp_dp) == 4 * NCCL_CONTEXT_BYTES
    hsdp = ParallelPlan(dp=64, global_batch=512, seq_len=4096, sharding="hsdp", hsdp_shard_size=8)
    assert nccl_bytes(hsdp) == 3 * NCCL_CONTEXT_BYTES  # shard and replicate groups


def test_expert_parallelism_adds_its_all_to_all_and_expert_data_parallel_groups():
    dense = ParallelPlan(dp=64, **_MOE)
    experts = ParallelPlan(dp=64, ep=8, **_MOE)  # expert DP = 64 / 8
    assert nccl_bytes(experts) - nccl_bytes(dense) == 2 * NCCL_CONTEXT_BYTES
    whole = ParallelPlan(dp=8, ep=8, **{**_MOE, "global_batch": 64})  # EP spans DP: no expert DP group
    assert nccl_bytes(whole) == 3 * NCCL_CONTEXT_BYTES


def test_the_cpu_trial_device_keeps_its_small_constant():
    plan = ParallelPlan(tp=2, dp=2, global_batch=8, seq_len=256)
    assert reserve_bytes(make_cluster(num_gpus=4, gpu="cpu"), plan) < 100 * 1024**2
