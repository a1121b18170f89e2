"""Issue 21's acceptance on the committed data: no published layout that ran is called out of memory."""

from benchmarks import memory_published, moe_recipes


def test_no_published_layout_that_ran_is_called_out_of_memory():
    rows, skipped = memory_published.modern_rows()
    results = [memory_published.predict(r) for r in memory_published.ROWS + rows]
    assert len(results) >= 190  # dense presets, rows read from their HF shape, and the MoE rows
    assert sum(r.spec is not None and r.plan.get("ep", 1) > 1 for r in rows) >= 60
    assert [r["name"] for r in results if r["called_oom"]] == []
    # the MoE model zoo's GB200 MXFP8 row ran only with its experts' inputs offloaded ("activation offloading
    # required"): priced with them (plan.offload_modules), not as a memory saver beyond the plan
    zoo = next(r for r in rows if r.name == "zoo-qwen3-235b-gb200-256g-tp1pp4vp6ep64-hybridep-mxfp8-mbs3")
    assert zoo.plan["offload_modules"] == ("expert_fc1", "moe_act") and not moe_recipes.offload_modules({})
    assert set(skipped) <= {  # each with its reason in the table
        "llama3-paper-405b-h100-8192g-tp8cp1pp16-8k",
        "llama3-paper-405b-h100-16384g-tp8cp1pp16-8k",
        "llama3-paper-405b-h100-16384g-tp8cp16pp16-128k",
        "dsv3-report-671b-h800-2048g-pp16ep64-fp8",
        "zoo-qwen3-235b-h100-256g-tp2pp1ep8-deepep-fsdp",
        "zoo-qwen3-235b-gb300-256g-tp1pp4ep32-hybridep-mxfp8-mbs2",
    }


def test_an_unprinted_megatron_micro_batch_is_one():
    rows, _ = memory_published.modern_rows()
    weak = next(r for r in rows if r.name == "mlm-weakscaling-gpt-462b-h100-6144g")
    assert weak.plan["micro_batch"] == 1 and weak.spec is not None


def test_fsdp_stacks_are_priced_with_the_numerics_they_ran():
    """llm-foundry rows take its fused cross-entropy, NeMo AutoModel rows their bf16 model and loss; every one
    of those layouts fits; priced with torchtitan's fp32 stores and eager fp32 loss 17 would not (12 of
    llm-foundry's, 5 of AutoModel's)."""
    import yaml

    from autotune.catalog import make_cluster
    from autotune.costmodel import estimate
    from autotune.plan import LossKernel, StoreDtype
    from benchmarks import modern_runs

    rows, _ = memory_published.modern_rows()
    results = [memory_published.predict(r) for r in rows if r.name.startswith(("foundry-", "automodel-"))]
    assert len(results) == 79 and not [r["name"] for r in results if r["called_oom"]]
    entries = [
        e
        for e in yaml.safe_load(memory_published.MODERN.read_text())
        if e["framework"] in ("llm-foundry", "automodel")
    ]
    plans = {}
    for e in entries:
        if e.get("moe"):
            model, plan = moe_recipes.row_model(e), moe_recipes.row_plan(e)
        else:
            model = modern_runs.row_model(e)
            plan = modern_runs._plan(e, model)
        plans[e["id"]] = (model, make_cluster(num_gpus=e["num_gpus"], gpu=e["gpu"]), plan)
    assert {p.loss_kernel for _, _, p in plans.values() if p.framework.value == "fsdp"} >= {
        LossKernel.FUSED,
        LossKernel.BF16,
    }
    qwen = plans["automodel-2510-qwen3-30b-a3b-h100-8g-ep8-fsdp8"][2]
    assert (qwen.weight_dtype, str(qwen.moe_dispatcher)) == (StoreDtype.BF16, "deepep")
    fp32 = dict(weight_dtype=StoreDtype.FP32, adam_dtype=None, loss_kernel=LossKernel.FP32)
    as_torchtitan = sum(not estimate(m, c, p.replace(**fp32)).feasible for m, c, p in plans.values())
    assert as_torchtitan == 17
