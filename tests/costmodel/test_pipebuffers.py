"""torch pipelining's per-micro-batch stage buffers (``costmodel.pipebuffers``): pinned to the installed
torch's source, counted per rank, and carried into the memory breakdown of framework fsdp plans only."""

import inspect

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.inflight import in_flight_microbatches
from autotune.costmodel.memory import pipeline_p2p_bytes, stage_memory
from autotune.costmodel.pipebuffers import boundary_bytes, stage_buffer_bytes, stage_output_bytes
from autotune.plan import ParallelPlan

MODEL = load_model("llama3-8b")
BASE = {"pp": 4, "dp": 2, "global_batch": 16, "seq_len": 4096, "recompute": "full"}  # 8 micro-batches


def test_torch_keeps_one_buffer_per_microbatch_in_its_source():
    """Tier-0 pin: receive buffers and gradient receive buffers are made per micro-batch and kept; the stage
    output is kept in ``fwd_cache`` for the backward."""
    from torch.distributed.pipelining.stage import PipelineStage, _PipelineStageBase

    forward = inspect.getsource(PipelineStage._setup_forward_recv_info)
    assert "for chunk_id in range(num_microbatches)" in forward and "_make_tensor_from_meta" in forward
    backward = inspect.getsource(_PipelineStageBase._setup_backward_recv_info)
    assert "for mb_index in range(num_microbatches)" in backward
    assert "_make_tensor_from_meta(grad_meta" in inspect.getsource(PipelineStage._create_grad_recv_info)
    assert "self.fwd_cache[fwd_chunk_id]" in inspect.getsource(_PipelineStageBase.forward_one_chunk)


def test_buffers_per_rank_of_a_1f1b_pipeline():
    """8 micro-batches, 4 stages: rank 0 receives nothing and holds 8 gradient buffers; a middle rank also
    holds the input buffers of the 8 - (4 - r) micro-batches not in flight; the last rank no gradient
    buffers."""
    plan = ParallelPlan(**BASE)
    one = boundary_bytes(MODEL, plan, 2)
    assert one == 4096 * 1 * MODEL.hidden_size * 2
    expected = {0: 8, 1: (8 - 3) + 8, 2: (8 - 2) + 8, 3: 8 - 1}
    for rank, count in expected.items():
        in_flight = in_flight_microbatches(plan, rank=rank)
        assert stage_buffer_bytes(MODEL, plan, rank=rank, in_flight=in_flight, e=2) == count * one, rank
        assert stage_output_bytes(MODEL, plan, rank=rank, e=2) == (0 if rank == 3 else one)


def test_interleaved_ranks_hold_buffers_for_each_local_stage():
    plan = ParallelPlan(**BASE, schedule="interleaved", virtual_stages=2)
    one = boundary_bytes(MODEL, plan, 2)
    in_flight = in_flight_microbatches(plan, rank=0)
    spare = max(0.0, 8 - in_flight)
    buffers = stage_buffer_bytes(MODEL, plan, rank=0, in_flight=in_flight, e=2)
    assert buffers == pytest.approx((spare + 16) * one)
    assert stage_output_bytes(MODEL, plan, rank=0, e=2) == 2 * one
    assert stage_output_bytes(MODEL, plan, rank=3, e=2) == one


def test_sequence_parallel_shards_the_boundary():
    plan = ParallelPlan(**{**BASE, "dp": 1}, tp=2, sequence_parallel=True)
    assert boundary_bytes(MODEL, plan, 2) == 4096 * MODEL.hidden_size * 2 / 2


def test_breakdown_carries_the_buffers_for_torch_pipelining_only():
    """framework fsdp: the comm line is the kept buffers, the stored activations grow by the in-flight
    outputs; Megatron keeps its two transfer buffers (``pipeline_p2p_bytes``)."""
    cluster = make_cluster(num_gpus=8)
    plan = ParallelPlan(**BASE, sharding="fsdp-full")  # no DDP bucket beside the buffers
    mem = stage_memory(MODEL, cluster, plan, rank=1)
    in_flight = in_flight_microbatches(plan, rank=1)
    assert mem.comm_buffer_bytes == pytest.approx(
        stage_buffer_bytes(MODEL, plan, rank=1, in_flight=in_flight, e=2)
    )
    megatron = ParallelPlan(**BASE, framework="megatron", sharding="zero1")
    assert stage_memory(MODEL, cluster, megatron, rank=1).comm_buffer_bytes == pytest.approx(
        pipeline_p2p_bytes(MODEL, megatron)
    )
    assert stage_buffer_bytes(MODEL, megatron, rank=1, in_flight=3.0, e=2) == 0.0
    no_pp = ParallelPlan(dp=8, global_batch=16, seq_len=4096)
    assert stage_output_bytes(MODEL, no_pp, rank=0, e=2) == 0.0
