"""The published MoE rows carry the recipe their run used (benchmarks/moe_runs.py reads it from the row)."""

import yaml

from benchmarks import modern_runs, moe_recipes, moe_runs


def _row(run_id: str) -> dict:
    rows = yaml.safe_load(moe_runs.DATA.read_text())
    return next(r for r in rows if r["id"] == run_id)


def test_deepseek_v3_25_09_rows_run_what_run_script_set():
    """Megatron-Bridge scripts/performance/run_script.py at fa0315ae2 (the 25.09 summary commit): DeepEP,
    the EP a2a overlap and ``mla_up_proj mlp`` on H100; token drop, ``mla_up_proj mlp moe_act`` on GB200."""
    h100 = _row("mb-2509-deepseekv3-h100-1024g-fp8-tp2pp8cp1vp4ep64")
    assert moe_recipes.dispatcher(h100) == "deepep"
    assert moe_recipes.recompute_modules(h100) == ("mla_up_proj", "mlp")
    assert moe_recipes.row_plan(h100).moe_a2a_overlap  # the EP a2a overlap with delayed wgrad: priced
    assert not {"EP a2a overlap", "delayed wgrad"} & set(moe_recipes.unpriced_knobs(h100))
    gb200 = _row("mb-2509-deepseekv3-gb200-256g-fp8-tp1pp4cp1vp4ep64")
    assert moe_recipes.dispatcher(gb200) == "alltoall"
    assert moe_recipes.recompute_modules(gb200) == ("mla_up_proj", "mlp", "moe_act")
    assert moe_recipes.row_plan(gb200).moe_capacity_factor == 1.0  # token drop, padded: priced
    assert "token drop" not in moe_recipes.unpriced_knobs(gb200)


def test_a_builders_all_to_all_dispatcher_wins_over_a_presets_flex_backend():
    """Megatron-Bridge 26.02 (c0b9a0003): the Qwen3-30B B200 preset names DeepEP, but the builder sets
    ``moe_token_dispatcher_type = "alltoall"`` (qwen3_llm_pretrain.py), so the flex backend is never used."""
    row = _row("mb-2602-qwen3-30b-a3b-b200-8g-mxfp8-tp1pp1cp1ep8")
    assert "'moe_flex_dispatcher_backend': 'deepep'" in row["notes"]
    assert moe_recipes.dispatcher(row) == "alltoall"
    gpt_oss = _row("mb-2511-gpt-oss-120b-gb200-64g-bf16-tp1pp1cp1ep64")  # 25.11: modules without selective
    assert moe_recipes.row_plan(gpt_oss).recompute.value == "none"


def test_the_recipes_overlap_switches_become_plan_fields():
    """The overlap knobs read from each release's code (docs/moe.md "read in full") reach the plan: 25.09's
    DeepSeek-V3 on H100 ran without grad-reduce overlap and without TE TP-comm overlap, its Qwen3-235B on
    GB200 with TP-comm overlap; 25.11's MXFP8 DeepSeek-V3 on GB200 without param-gather overlap. A row that
    leaves a knob null keeps the plan's default."""
    dsv3 = moe_recipes.row_plan(_row("mb-2509-deepseekv3-h100-1024g-fp8-tp2pp8cp1vp4ep64"))
    assert (dsv3.overlap_grad_reduce, dsv3.overlap_param_gather, dsv3.tp_comm_overlap) == (False, True, False)
    assert moe_recipes.row_plan(_row("mb-2509-qwen3-235b-a22b-gb200-64g-fp8-tp2pp1cp1ep64")).tp_comm_overlap
    mx = moe_recipes.row_plan(_row("mb-2511-deepseekv3-gb200-256g-fp8-mx-tp1pp8cp1vp4ep32"))
    assert not mx.overlap_param_gather and mx.overlap_grad_reduce and not mx.tp_comm_overlap
    row = _row("mb-2511-qwen3-235b-a22b-gb200-256g-bf16-tp1pp8cp1vp3ep32")
    row["knobs"] = {}  # nothing stated: the plan's defaults
    plan = moe_recipes.row_plan(row)
    assert (plan.overlap_grad_reduce, plan.overlap_param_gather, plan.tp_comm_overlap) == (True, True, False)


def test_torchtitan_moe_rows_are_priced_with_the_attention_kernel_their_code_ran():
    """torchtitan's DeepSeek-V3 under SDPA (Aug 2025: backends flash, efficient, math on Hopper) runs MLA's
    192 / 128 head dims on torch's memory-efficient kernel, flash needing one width (an H200 reports "No
    available kernel"): priced with that kernel's measured curve, the two SDPA rows land within 15 %;
    priced as FlashAttention-2 they would be 34-69 % fast. The FlexAttention twin stays FA2-priced (no flex
    curve)."""
    from autotune.costmodel import step_time

    rows = {r["id"]: r for r in yaml.safe_load(moe_runs.DATA.read_text()) if r["framework"] == "torchtitan"}
    sdpa = ("tt-2508-dsv3-16b-h100-96g-8g-ep8-sdpa", "tt-2508-dsv3-16b-h100-96g-8g-pp4v2-sdpa")
    for rid in sdpa:
        row = rows[rid]
        plan = moe_recipes.row_plan(row)
        assert (plan.framework.value, plan.compile, row["attention_kernel"]) == ("fsdp", False, "efficient")
        assert abs(moe_runs.predict(row)["error"]) <= 0.15
        model, cluster = moe_recipes.row_model(row), modern_runs.row_cluster(row)
        assert cluster.gpu.power_limit_w == 500 and cluster.gpu.memory_bytes > 90 * 1024**3  # Grand Teton
        fa2 = step_time(model, cluster, plan, attention_kernel="fa2")
        predicted = plan.tokens_per_step / fa2.step_time_s / plan.world_size
        assert predicted / row["measured"]["tokens_per_s_per_gpu"] - 1 > 0.30
    deepep = moe_recipes.row_plan(rows["tt-2512-dsv3-671b-h100-512g-pp8v2-ep32-deepep"])
    assert (str(deepep.moe_dispatcher), deepep.compile) == ("deepep", True)
    assert deepep.sharding.value == "fsdp-grad-op"  # torchtitan keeps parameters gathered under PP
    assert moe_recipes.row_plan(rows["tt-2510-dsv3-16b-h100-8g-ep8-opsac"]).recompute.value == "selective"


def test_megatron_rows_say_which_cross_entropy_ran_and_agree_with_their_knob():
    """``cross_entropy`` (benchmarks/data/README.md): Transformer Engine's on every Megatron-Bridge row, read
    per release; a row whose knobs say the loss was fused ran ``te`` or ``native``, never ``unfused``; the TE
    rows are priced with ``--loss-kernel fused``."""
    rows = [r for r in yaml.safe_load(moe_runs.DATA.read_text()) if str(r.get("framework")) == "megatron"]
    assert all(r.get("cross_entropy") in (None, "te", "native", "unfused") for r in rows)
    assert all(r["cross_entropy"] == "te" for r in rows if r["id"].startswith("mb-"))
    for r in rows:
        fused = (r.get("knobs") or {}).get("fused_cross_entropy")
        if fused is not None:
            assert (r.get("cross_entropy") != "unfused") == bool(fused), r["id"]
    moe = [r for r in rows if r.get("moe") and r.get("cross_entropy") == "te"]
    assert moe and all(str(moe_recipes.row_plan(r).loss_kernel) == "fused" for r in moe)
    dense = next(r for r in rows if not r.get("moe") and r.get("cross_entropy") == "te")
    assert str(modern_runs._plan(dense, modern_runs.row_model(dense)).loss_kernel) == "fused"


def test_the_precision_aware_optimizer_and_bf16_moments_reach_the_plans_of_the_rows_that_ran_them():
    """Megatron-LM's MoE recipes set ``use_precision_aware_optimizer`` with ``exp_avg_dtype: bf16``;
    Megatron-Bridge's DeepSeek-V3 recipe "bf16 main grads and Adam moments"; moments not stated stay fp32."""
    recipe = _row("mlm-moerecipe-deepseek-v3-gb200-mxfp8-256gpu-tp1pp4ep64")
    plan = moe_recipes.row_plan(recipe)
    assert plan.precision_aware_optimizer and str(plan.adam_dtype) == "bf16"
    assert "precision-aware optimizer" not in moe_recipes.unpriced_knobs(recipe)
    zoo = moe_recipes.row_plan(_row("zoo-qwen3-235b-gb300-256g-tp1pp4ep32-hybridep-mxfp8-mbs2"))
    assert zoo.precision_aware_optimizer and zoo.adam_dtype is None
    bridge = moe_recipes.row_plan(_row("mb-260401-deepseekv3-b300-256g-mxfp8-tp1pp8cp1ep8"))
    assert bridge.precision_aware_optimizer and str(bridge.adam_dtype) == "bf16"
    off = moe_recipes.row_plan(_row("mb-2608-qwen3-30b-a3b-gb300-8g-mxfp8-tp1pp1cp1ep8-mbs8"))
    assert not off.precision_aware_optimizer  # "use_precision_aware_optimizer False"
