"""MoE and MLA in the cost model: expert parallelism legality, expert sharding, dispatch, FLOPs."""

import dataclasses
import json

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.costmodel import estimate, flops, gemms, moe
from autotune.costmodel.memory import memory_breakdown
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan


def _plan(**kw):
    return ParallelPlan(**{"global_batch": 64, "seq_len": 4096, **kw})


def test_ep_on_a_dense_model_is_illegal_with_a_reason():
    plan = _plan(dp=8, ep=8, sharding="fsdp-full")
    reasons = check_plan(plan, load_model("llama3-8b"), make_cluster(num_gpus=8))
    assert any("dense model" in r for r in reasons)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dp": 4, "ep": 8, "framework": "megatron"}, "EP x ETP = 8 x 1 to divide"),
        ({"dp": 8, "ep": 8, "framework": "fsdp", "sharding": "none"}, "borrows EP.*--sharding fsdp-full"),
        ({"dp": 2, "ep": 4, "framework": "fsdp", "sharding": "fsdp-full"}, "= 2; EP 4 does not divide it$"),
        (
            {
                "dp": 4,
                "tp": 2,
                "ep": 2,
                "etp": 4,
                "framework": "fsdp",
                "sharding": "fsdp-full",
                "sequence_parallel": True,
            },
            "ETP = 1 or ETP = TP",
        ),
        ({"dp": 8, "ep": 8, "framework": "deepspeed", "sharding": "zero3"}, "ZeRO-3"),
        ({"dp": 6, "ep": 4, "framework": "deepspeed", "global_batch": 60}, "divide DP"),
    ],
)
def test_each_framework_places_ep_its_own_way(kw, message):
    with pytest.raises(ConfigError, match=message):
        _plan(**kw)


def test_model_rules_for_experts():
    mixtral, cluster = load_model("mixtral-8x7b"), make_cluster(num_gpus=16)
    assert any(
        "does not divide the 8 routed" in r
        for r in check_plan(_plan(dp=16, ep=16, sharding="fsdp-full"), mixtral, cluster)
    )
    assert any(
        "needs --sequence-parallel" in r
        for r in check_plan(_plan(tp=2, dp=8, ep=8, framework="megatron"), mixtral, cluster)
    )
    assert not check_plan(
        _plan(tp=2, dp=8, ep=8, framework="megatron", sequence_parallel=True), mixtral, cluster
    )


def test_experts_shard_over_ep_and_their_optimizer_over_expert_dp():
    mixtral, cluster = load_model("mixtral-8x7b"), make_cluster(num_gpus=64)
    one = memory_breakdown(mixtral, cluster, _plan(dp=64, framework="megatron", sharding="zero1"))
    eight = memory_breakdown(mixtral, cluster, _plan(dp=64, ep=8, framework="megatron", sharding="zero1"))
    dense = mixtral.total_params - mixtral.expert_params_per_layer * mixtral.num_layers
    experts = mixtral.expert_params_per_layer * mixtral.num_layers
    assert one.weights_bytes == pytest.approx(2 * mixtral.total_params)
    assert eight.weights_bytes == pytest.approx(2 * (dense + experts / 8))
    # Megatron's distributed optimizer: 12 B/param over DP (64) for dense, over expert DP (8) for experts
    assert eight.optimizer_bytes == pytest.approx(12 * (dense / 64 + experts / 8 / 8), rel=1e-3)


def test_all_to_all_inside_a_node_beats_across_nodes():
    cluster = make_cluster(num_gpus=64)
    inside, across = (moe.all_to_all_s(1e9, cluster, n, 1) for n in (8, 16))
    assert 0 < inside < across
    assert moe.all_to_all_s(1e9, cluster, 1, 1) == 0.0


def test_dispatch_counts_four_exchanges_and_grows_with_recompute():
    m, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=8)
    plan = _plan(dp=8, ep=8, sharding="fsdp-full")
    one_way = moe.all_to_all_s(4096 * 8 * m.hidden_size * 2, cluster, 8, 1)
    assert moe.dispatch_s(m, cluster, plan, 4096, 2) == pytest.approx(4 * one_way)
    full = moe.dispatch_s(m, cluster, plan.replace(recompute="full"), 4096, 2)
    assert full == pytest.approx(6 * one_way)
    assert moe.dispatch_s(m, cluster, plan.replace(ep=1), 4096, 2) == 0.0


def test_expert_gemms_pay_tile_quantization_and_sum_to_the_active_flops():
    m = load_model("qwen3-30b-a3b")
    plan = _plan(dp=8, ep=8, sharding="fsdp-full")
    tokens = 4096
    shapes = gemms.block_gemms(m, plan, tokens, fused=True)
    experts = shapes[-2:]
    assert all(g.m % moe.GEMM_TILE_ROWS == 0 for g in experts)  # rows rounded up to whole tiles
    exact = moe.tokens_per_expert(m, plan, tokens)
    padded_flops = sum(g.flops for g in shapes)
    exact_flops = padded_flops - sum(g.flops for g in experts) * (1 - exact / experts[0].m)
    assert exact_flops == pytest.approx(tokens * flops.layer_gemm_flops_per_token(m), rel=1e-6)


def test_moe_flops_follow_active_parameters():
    m = load_model("mixtral-8x7b")
    # 6 x active non-embedding params (Kaplan et al. 2020's 6N) + the LM head counted once, no attention
    six_n = 6 * (m.active_params - 2 * m.vocab_size * m.hidden_size) + 6 * m.hidden_size * m.vocab_size
    attn = 3 * m.num_layers * flops.attention_flops_per_token(m, 4096)
    assert flops.model_flops_per_token(m, 4096) - attn == pytest.approx(six_n, rel=2e-3)


def test_mla_and_sliding_windows_in_attention_flops():
    ds = load_model("deepseek-v3")  # QK^T over 192 dims, PV over 128, 128 heads
    assert flops.attention_flops_per_token(ds, 4096) == 2 * 4096 * 128 * (192 + 128)
    mistral = load_model("mistral-7b")  # window 4096: a 32k sequence visits far fewer keys
    full = 4 * 32768 * mistral.hidden_size
    assert flops.attention_flops_per_token(mistral, 32768) < 0.3 * full
    assert flops.attention_flops_per_token(mistral, 4096) == 4 * 4096 * mistral.hidden_size


def test_deepseek_v3_on_eight_a100_is_infeasible_with_the_reason():
    est = estimate(
        load_model("deepseek-v3"),
        make_cluster(num_gpus=8, gpu="a100-40gb"),
        _plan(tp=8, global_batch=8, framework="megatron", sequence_parallel=True, sharding="none"),
    )
    assert not est.feasible and "out of memory" in est.reasons[0]


def test_estimate_json_reports_what_was_read(capsys):
    assert (
        main(
            [
                "estimate",
                "--model",
                "mixtral-8x7b",
                "--gpus",
                "8",
                "--ep",
                "8",
                "--sharding",
                "fsdp-full",
                "--global-batch",
                "64",
                "--seq-len",
                "4096",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["name"] == "mixtral-8x7b"
    assert out["model"]["total_params"] / 1e9 == pytest.approx(46.7, rel=0.01)
    assert out["model"]["active_params"] / 1e9 == pytest.approx(12.9, rel=0.01)
    assert out["plan"]["ep"] == 8 and out["time_breakdown"]["ep_comm_s"] > 0
    assert (
        main(
            [
                "estimate",
                "--model",
                "mixtral-8x7b",
                "--gpus",
                "8",
                "--ep",
                "8",
                "--sharding",
                "fsdp-full",
                "--global-batch",
                "64",
                "--seq-len",
                "4096",
            ]
        )
        == 0
    )
    assert "46.7B total, 12.9B active" in capsys.readouterr().out


def test_local_layers_visit_their_window_or_chunk():
    from autotune.modelshape import attention_span_fraction

    gemma = load_model("gemma2-27b")  # 23 of 46 layers slide over 4096 keys
    s = 16384
    sliding = (4096 - 4096**2 / (2 * s)) / s
    assert attention_span_fraction(gemma, s, 0.5) == pytest.approx((23 * sliding + 23 * 0.5) / 46)
    assert attention_span_fraction(gemma, 4096, 0.5) == pytest.approx(0.5)
    scout = load_model("autotune/data/hf_configs/llama4-scout-17b-16e.json")  # 36 chunked layers of 8192
    assert attention_span_fraction(scout, 32768, 0.5) == pytest.approx((36 * 4096 / 32768 + 12 * 0.5) / 48)


def test_routed_copies_add_activation_memory():
    mixtral, cluster = load_model("mixtral-8x7b"), make_cluster(num_gpus=8)
    plan = _plan(dp=8, ep=8, sharding="fsdp-full", global_batch=8)
    top2 = memory_breakdown(mixtral, cluster, plan).activations_bytes
    top4_model = dataclasses.replace(mixtral, experts_per_token=4)
    top4 = memory_breakdown(top4_model, cluster, plan).activations_bytes
    assert top4 > top2


def test_megatron_keeps_one_h_wide_tensor_per_routed_copy_torchtitan_two():
    """Megatron applies the router probability inside the expert activation (weighted SwiGLU); torchtitan
    scales the routed input first, so it keeps the unscaled copy too (moe.routed_saved_h_tensors)."""
    mixtral, cluster = load_model("mixtral-8x7b"), make_cluster(num_gpus=8)
    megatron = _plan(dp=8, ep=8, sharding="zero1", global_batch=8, framework="megatron")
    titan = megatron.replace(framework="fsdp", sharding="fsdp-full")
    assert (moe.routed_saved_h_tensors(megatron), moe.routed_saved_h_tensors(titan)) == (1, 2)
    one = memory_breakdown(mixtral, cluster, megatron).activations_bytes
    two_routed = memory_breakdown(dataclasses.replace(mixtral, experts_per_token=4), cluster, megatron)
    per_copy = (two_routed.activations_bytes - one) / 2  # two more copies of h per token per MoE block
    tokens = megatron.micro_batch * megatron.seq_len * mixtral.num_layers
    ffn_tensors = 3 * mixtral.expert_ffn_hidden_size * 2  # fused SwiGLU: fc1 output (2 f) + its output (f)
    assert per_copy == pytest.approx(tokens * (mixtral.hidden_size * 2 + ffn_tensors), rel=0.05)


def test_ep64_inside_an_nvl72_rack_runs_on_nvlink():
    """EP 64 on GB200 NVL72 exchanges over NVLink 5, not over the trays' NICs."""
    rack = make_cluster(num_gpus=256, gpu="gb200")
    trays = dataclasses.replace(rack, nvlink_domain_gpus=None)
    nbytes = 1e9
    nvlink = moe.all_to_all_s(nbytes, rack, 64, 1)
    assert nvlink == pytest.approx(nbytes * 63 / 64 / (900e9 * 0.85) + 8e-6)
    assert moe.all_to_all_s(nbytes, trays, 64, 1) > 10 * nvlink


def test_remote_nodes_per_token_is_hypergeometric():
    """Balanced top-k routing over E experts spread on N nodes: each other node is missed with probability
    C(E - E/N, k) / C(E, k)."""
    qwen = load_model("qwen3-235b-a22b")  # 128 experts, top-8
    assert moe.remote_nodes_per_token(qwen, 1) == 0.0
    assert moe.remote_nodes_per_token(qwen, 4) == pytest.approx(3 * (1 - 0.0927), abs=1e-3)
    assert moe.remote_nodes_per_token(qwen, 128) == pytest.approx(8 * 127 / 128, rel=1e-9)  # all distinct


def test_deepep_sends_a_token_once_per_node_across_nodes_only():
    """DeepEP / HybridEP (Megatron flex): across nodes the NICs carry one copy per destination node, not one
    per routed expert; inside a node nothing changes."""
    qwen = load_model("qwen3-235b-a22b")
    cluster = make_cluster(num_gpus=256, gpu="h100-sxm")
    kw = dict(
        tp=2,
        pp=8,
        dp=16,
        ep=32,
        virtual_stages=4,
        schedule="interleaved",
        global_batch=2048,
        seq_len=4096,
        framework="megatron",
        sharding="zero1",
        sequence_parallel=True,
    )
    plain, flex = _plan(**kw), _plan(**kw, moe_dispatcher="deepep")
    a2a, deepep = (moe.dispatch_s(qwen, cluster, p, 4096, 2) for p in (plain, flex))
    assert 0.3 < deepep / a2a < 0.6  # 8 x 3/4 = 6 copies over IB against ~2.7
    inside = dict(kw, pp=32, dp=4, ep=8, virtual_stages=3, global_batch=2048)
    assert moe.dispatch_s(qwen, cluster, _plan(**inside), 4096, 2) == moe.dispatch_s(
        qwen, cluster, _plan(**inside, moe_dispatcher="hybridep"), 4096, 2
    )


def test_each_framework_offers_its_own_dispatchers():
    """Megatron runs all four; torchtitan (fsdp) all-to-all and DeepEP (``expert_parallel_comm_backend``,
    v0.2.1); DeepSpeed-MoE all-to-all only."""
    fsdp = {"framework": "fsdp", "sharding": "fsdp-full"}
    assert _plan(dp=8, ep=8, moe_dispatcher="deepep", **fsdp).moe_dispatcher.value == "deepep"
    deepspeed = {"framework": "deepspeed", "sharding": "zero1"}
    for fw, dispatcher in ((fsdp, "hybridep"), (fsdp, "allgather"), (deepspeed, "deepep")):
        refused = f"framework {fw['framework']} has no moe-dispatcher {dispatcher}"
        with pytest.raises(ConfigError, match=refused):
            _plan(dp=8, ep=8, moe_dispatcher=dispatcher, **fw)


def test_a_capacity_factor_scales_expert_rows_exchange_and_routed_memory():
    """Padded to capacity ``c`` every expert takes ``c`` x the balanced load: its GEMM rows, the all-to-all
    bytes and the stored routed copies scale by ``c`` (costmodel.moe ``busiest_load``)."""
    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16, gpu="h100-sxm")
    base = ParallelPlan(dp=16, ep=16, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
    one, two = base.replace(moe_capacity_factor=1.0), base.replace(moe_capacity_factor=2.0)
    tokens = 4096.0
    rows = {p.moe_capacity_factor: gemms.block_gemms(model, p, tokens, fused=True)[-1].m for p in (one, two)}
    assert rows[2.0] == pytest.approx(2 * rows[1.0], rel=0.02)  # tile rounding aside
    assert moe.dispatch_s(model, cluster, two, tokens, 2) > 1.8 * moe.dispatch_s(
        model, cluster, one, tokens, 2
    )
    assert moe.dispatch_s(model, cluster, one, tokens, 2) == pytest.approx(
        moe.dispatch_s(model, cluster, base, tokens, 2)
    )
    act = {p.moe_capacity_factor: memory_breakdown(model, cluster, p).activations_bytes for p in (one, two)}
    assert act[2.0] > act[1.0]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"framework": "fsdp", "sharding": "fsdp-full"}, "torchtitan routes dropless"),
        ({"moe_dispatcher": "deepep"}, "alltoall dispatcher"),
        ({"moe_capacity_factor": 0.0}, "must be > 0"),
    ],
)
def test_capacity_factor_legality_names_the_fix(kw, message):
    plan = {
        "dp": 16,
        "ep": 16,
        "global_batch": 64,
        "seq_len": 4096,
        "framework": "megatron",
        "sharding": "zero1",
    }
    with pytest.raises(ConfigError, match=message):
        ParallelPlan(**{**plan, "moe_capacity_factor": 1.0, **kw})


def test_a_capacity_factor_on_a_dense_model_is_refused():
    plan = ParallelPlan(
        dp=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1", moe_capacity_factor=1.0
    )
    assert any(
        "dense model" in r for r in check_plan(plan, load_model("llama3-8b"), make_cluster(num_gpus=8))
    )


def test_the_all_gather_dispatcher_moves_every_token_to_every_rank():
    """Megatron's allgather dispatcher: (ep - 1) tokens' bytes per token each way, where the all-to-all moves
    top-k (ep - 1) / ep: 4x more for Mixtral (top-2) on EP 8, about the same for Qwen3-30B-A3B (top-8)."""
    cluster = make_cluster(num_gpus=8, gpu="h100-sxm")

    def ratio(name):
        model = load_model(name)
        plan = ParallelPlan(dp=8, ep=8, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
        gather = moe.dispatch_s(model, cluster, plan.replace(moe_dispatcher="allgather"), 4096.0, 2)
        return gather / moe.dispatch_s(model, cluster, plan, 4096.0, 2)

    assert 3.5 < ratio("mixtral-8x7b") < 4.6
    assert 0.95 < ratio("qwen3-30b-a3b") < 1.3  # plus the gathered routing map and probabilities
    with pytest.raises(ConfigError, match="framework fsdp has no moe-dispatcher allgather"):
        ParallelPlan(
            dp=8, ep=8, global_batch=64, seq_len=4096, sharding="fsdp-full", moe_dispatcher="allgather"
        )


def test_a_load_imbalance_loads_the_busiest_rank_unless_capacity_caps_it():
    """Dropless, the busiest rank's experts take ``moe_load_imbalance`` x the balanced rows, exchange and
    buffers; padded to capacity, the capacity sets them whatever the imbalance."""
    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=16, gpu="h100-sxm")
    base = ParallelPlan(dp=16, ep=16, global_batch=64, seq_len=4096, framework="megatron", sharding="zero1")
    skew = base.replace(moe_load_imbalance=1.5)
    rows = {p: gemms.block_gemms(model, p, 4096.0, fused=True)[-1].m for p in (base, skew)}
    assert rows[skew] == pytest.approx(1.5 * rows[base], rel=0.03)
    assert estimate(model, cluster, skew).step_time_s > estimate(model, cluster, base).step_time_s
    capped = skew.replace(moe_capacity_factor=1.0)
    assert gemms.block_gemms(model, capped, 4096.0, fused=True)[-1].m == rows[base]
    with pytest.raises(ConfigError, match="moe-load-imbalance is the busiest"):
        base.replace(moe_load_imbalance=0.8)


def test_deepspeed_moe_pays_its_dense_dispatch_quadratically():
    """DeepSpeed-MoE's dispatch/combine einsums over a dense [S, E, C] mask: two GEMMs of S x (top-k S) x h
    before the experts, and the fp32 combine weights and cast mask kept for backward, both growing with the
    square of the micro-batch's tokens (gemms._deepspeed_dispatch, activations.dense_dispatch_bytes)."""
    from autotune.costmodel.activations import LayerShape, dense_dispatch_bytes, kernels_for

    model = load_model("qwen3-30b-a3b")
    plan = ParallelPlan(dp=16, ep=8, global_batch=64, seq_len=4096, framework="deepspeed", sharding="zero1")
    *_, dispatch, combine, up, down = gemms.block_gemms(model, plan, 4096.0, fused=False)
    assert (dispatch.m, dispatch.n, dispatch.k) == (8 * 4096, model.hidden_size, 4096)
    assert (combine.m, combine.n, combine.k) == (4096, model.hidden_size, 8 * 4096)
    megatron = plan.replace(framework="megatron")
    assert (
        len(gemms.block_gemms(model, megatron, 4096.0, fused=False))
        == len(gemms.block_gemms(model, plan, 4096.0, fused=False)) - 2
    )
    one, two = (LayerShape.of(model, plan.replace(micro_batch=m, global_batch=64 * m)) for m in (1, 2))
    k = kernels_for(plan)
    assert dense_dispatch_bytes(two, 2, k) == pytest.approx(4 * dense_dispatch_bytes(one, 2, k))
    assert dense_dispatch_bytes(one, 2, kernels_for(megatron)) == 0.0
