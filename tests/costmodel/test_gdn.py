"""Gated DeltaNet layers (Qwen3-Next, Qwen3.5): what they add to parameters, FLOPs, GEMMs, time and memory,
and the plans whose parts are not priced."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune import modelshape
from autotune.catalog import load_model, make_cluster
from autotune.costmodel import compute, estimate, flops, gemms
from autotune.plan import ParallelPlan

CONFIGS = Path(__file__).resolve().parents[2] / "autotune" / "data" / "hf_configs"
QWEN3_NEXT = str(CONFIGS / "qwen3-next-80b-a3b.json")


@pytest.fixture(scope="module")
def qwen3_next():
    return load_model(QWEN3_NEXT)


def _softmax_twin(model):
    """The same model with softmax attention on every layer and no output gate."""
    return dataclasses.replace(model, num_linear_layers=0, attention_output_gate=False)


def test_chunked_delta_rule_flops_follow_the_per_chunk_products(qwen3_next):
    """Per token and value head: ``6 C d_k + 4 C d_v + 2 C^2 / 3 + 6 d_k d_v`` with C = 64 (the docstring's
    sum of the chunkwise products), times the value heads and the Gated DeltaNet share of the layers."""
    c, d = 64, 128
    per_head = 6 * c * d + 4 * c * d + 2 * c * c / 3 + 6 * d * d
    expected = 32 * per_head * 36 / 48
    assert flops.linear_attention_flops_per_token(qwen3_next) == pytest.approx(expected)
    assert flops.linear_attention_flops_per_token(_softmax_twin(qwen3_next)) == 0.0


def test_softmax_attention_work_is_only_the_softmax_layers(qwen3_next):
    twin = _softmax_twin(qwen3_next)
    for seq in (4096, 32768):
        ratio = flops.attention_flops_per_token(qwen3_next, seq) / flops.attention_flops_per_token(twin, seq)
        assert ratio == pytest.approx(12 / 48)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("fused", [True, False])
def test_block_gemms_sum_to_the_mean_blocks_gemm_flops(qwen3_next, tp, fused):
    """The GEMM list of the mean block (softmax attention with its gate, Gated DeltaNet projections by
    their shares) holds the FLOPs ``flops.layer_gemm_flops_per_token`` counts, dense and router GEMMs
    included; the routed experts' rows are tile-rounded, so they are left out of the comparison."""
    plan = ParallelPlan(tp=tp, dp=8 // tp, global_batch=64, seq_len=4096, sequence_parallel=tp > 1)
    tokens = 4096.0
    shapes = gemms.block_gemms(qwen3_next, plan, tokens, fused=fused)[:-2]
    routed = qwen3_next.experts_per_token * 3 * qwen3_next.hidden_size * qwen3_next.expert_ffn_hidden_size
    expected = (flops.layer_gemm_flops_per_token(qwen3_next) - 2 * routed) * tokens / tp
    assert sum(g.flops for g in shapes) == pytest.approx(expected, rel=1e-9)


def test_mixer_weights_are_the_layer_mean(qwen3_next):
    k, v, h = 16 * 128, 32 * 128, 2048
    gdn = h * (2 * k + 2 * v) + h * 64 + v * h
    attn = 2 * h * 16 * 256 + 2 * h * 2 * 256 + h * 16 * 256  # q, o, k, v and the gate
    assert modelshape.linear_weight_params(qwen3_next) == gdn
    assert modelshape.attention_weight_params(qwen3_next) == attn
    assert modelshape.mixer_weight_params(qwen3_next) == pytest.approx((36 * gdn + 12 * attn) / 48)


def test_the_delta_rule_kernel_is_priced_by_its_bytes_at_these_shapes(qwen3_next):
    """At d_k = d_v = 128 the kernel moves about 3 KB per token and value head for 0.18 MFLOP, so on an
    H100 its bytes bind (``compute.linear_attention_s``)."""
    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")
    tokens = 8192.0
    rate = 989e12 * cluster.gpu.gemm_efficiency
    t = compute.linear_attention_s(qwen3_next, cluster, tokens, rate)
    by_bytes = tokens * flops.linear_attention_bytes_per_token(qwen3_next) / compute.hbm_rate(cluster)
    assert t == pytest.approx(by_bytes)
    assert t > tokens * flops.linear_attention_flops_per_token(qwen3_next) / rate
    assert compute.linear_attention_s(_softmax_twin(qwen3_next), cluster, tokens, rate) == 0.0


def test_gated_deltanet_layers_save_more_than_the_attention_they_replace(qwen3_next):
    """Per token the Gated DeltaNet layer saves its convolution's input and output, z, o, the norm output
    and the kernel's per-head matrices: wider than Qwen3-Next's softmax layers here, so the same plan
    stores more activations than its softmax twin."""
    assert modelshape.linear_activation_width(qwen3_next) > modelshape.attention_activation_width(
        _softmax_twin(qwen3_next)
    )
    cluster = make_cluster(num_gpus=64, gpu="h100-sxm")
    plan = ParallelPlan(dp=64, ep=8, global_batch=512, seq_len=4096, sharding="zero1", framework="megatron")
    with_gdn = estimate(qwen3_next, cluster, plan).memory.activations_bytes
    twin = estimate(_softmax_twin(qwen3_next), cluster, plan).memory.activations_bytes
    assert with_gdn > twin


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(tp=32, dp=2, sequence_parallel=True), "Gated DeltaNet key heads: TP 32, 16 key heads"),
        (dict(cp=2, dp=32), "context parallelism of Gated DeltaNet layers is not priced"),
        (dict(dp=64, recompute="selective"), "selective recompute of Gated DeltaNet layers"),
        (dict(tp=2, dp=32, ep=1, framework="deepspeed", sharding="zero1"), "DeepSpeed AutoTP"),
    ],
)
def test_what_is_not_priced_is_refused_with_the_fix(qwen3_next, changes, message):
    cluster = make_cluster(num_gpus=64, gpu="h100-sxm")
    base = dict(
        ep=8, global_batch=512, seq_len=4096, sharding="zero1", framework="megatron", recompute="full"
    )
    est = estimate(qwen3_next, cluster, ParallelPlan(**{**base, **changes}))
    assert any(message in r for r in est.reasons), est.reasons
