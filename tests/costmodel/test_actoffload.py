"""Megatron's fine-grained activation offloading of the routed experts' inputs (``plan.offload_modules``,
``costmodel.actoffload``): what leaves the device, what the host holds, what the copies cost, which plans
Megatron refuses."""

import dataclasses

import pytest
from clirun import one_line, run_cli

from autotune.catalog import load_gpu, load_model, make_cluster
from autotune.costmodel import actoffload, estimate
from autotune.costmodel.activations import kernels_for
from autotune.costmodel.offload import PCIE_BYTES_PER_S, host_link_bytes_per_s
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan

QWEN = load_model("qwen3-30b-a3b")  # 48 MoE layers, top-8 of 128 experts of 768, hidden 2048


def _plan(**kw) -> ParallelPlan:
    base = dict(
        dp=16,
        ep=8,
        micro_batch=2,
        global_batch=128,
        seq_len=4096,
        sharding="zero1",
        framework="megatron",
        recompute="selective",
        recompute_modules=("moe_act", "layernorm"),
    )
    return ParallelPlan(**{**base, **kw})


def test_each_module_moves_its_saved_input():
    """expert_fc1: one h-wide copy per routed token (16-bit); moe_act: the FC1 output, two expert-ffn
    halves per routed copy."""
    tokens, k = 2 * 4096, kernels_for(_plan())
    fc1 = actoffload.offloaded_bytes_per_layer(QWEN, _plan(offload_modules=("expert_fc1",)), e=2, k=k)
    act = actoffload.offloaded_bytes_per_layer(QWEN, _plan(offload_modules=("moe_act",)), e=2, k=k)
    assert fc1 == pytest.approx(tokens * 8 * 2048 * 2)
    assert act == pytest.approx(tokens * 8 * 2 * 768 * 2)
    both = actoffload.offloaded_bytes_per_layer(
        QWEN, _plan(offload_modules=("expert_fc1", "moe_act")), e=2, k=k
    )
    assert both == pytest.approx(fc1 + act)
    fp8 = _plan(offload_modules=("expert_fc1",), precision="fp8")
    assert actoffload.offloaded_bytes_per_layer(QWEN, fp8, e=2, k=kernels_for(fp8)) == pytest.approx(fc1 / 2)


def test_the_device_keeps_two_layers_and_the_host_takes_the_rest():
    cluster = make_cluster(num_gpus=16, gpu="gb200")
    plain, offloaded = _plan(), _plan(offload_modules=("expert_fc1", "moe_act"))
    a, b = estimate(QWEN, cluster, plain), estimate(QWEN, cluster, offloaded)
    per_layer = actoffload.offloaded_bytes_per_layer(QWEN, offloaded, e=2, k=kernels_for(offloaded))
    freed = (QWEN.num_layers - actoffload.RESIDENT_LAYERS) * per_layer  # PP 1: one micro-batch in flight
    assert a.memory.activations_bytes - b.memory.activations_bytes == pytest.approx(freed)
    assert b.memory.host_bytes_per_node - a.memory.host_bytes_per_node == pytest.approx(
        QWEN.num_layers * per_layer * cluster.gpus_per_node
    )


def test_the_copies_hide_behind_the_block_on_c2c_and_not_over_pcie():
    """GB200's NVLink-C2C moves most of a layer's inputs within its compute (Qwen3-30B's small experts
    move many bytes per FLOP: not all); a PCIe host at 20 GB/s far less."""
    offloaded = _plan(offload_modules=("expert_fc1", "moe_act"))
    fast = estimate(QWEN, make_cluster(num_gpus=16, gpu="gb200"), offloaded)
    slow = estimate(QWEN, make_cluster(num_gpus=16, gpu="b200"), offloaded)
    assert fast.time.offload_s < 0.2 * slow.time.offload_s
    assert slow.time.offload_s > 0.5 * slow.step_time_s
    big = load_model("qwen3-235b-a22b")  # 4096 wide, experts of 1536: more FLOPs per offloaded byte
    plan = _plan(pp=4, dp=64, ep=64, global_batch=512, offload_modules=("expert_fc1", "moe_act"))
    wide = estimate(big, make_cluster(num_gpus=256, gpu="gb200"), plan)
    assert wide.time.offload_s < 0.02 * wide.step_time_s
    assert slow.step_time_s > estimate(QWEN, make_cluster(num_gpus=16, gpu="b200"), _plan()).step_time_s
    assert host_link_bytes_per_s(load_gpu("gb200")) == 225e9
    assert host_link_bytes_per_s(load_gpu("h100-sxm")) == PCIE_BYTES_PER_S


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(offload_modules=("core_attn",)), "core_attn is a Megatron module autotune does not price"),
        (dict(offload_modules=("experts",)), "unknown module 'experts'"),
        (dict(framework="fsdp", sharding="fsdp-full", recompute="none", recompute_modules=()), "--framework"),
        (dict(offload_activation_layers=2), "offload-activation-layers"),
        (dict(recompute_modules=("moe",)), "recomputed whole"),
        (dict(recompute="full", recompute_modules=()), "recomputed whole"),
    ],
)
def test_plans_megatron_refuses_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        _plan(**{"offload_modules": ("expert_fc1",), **changes})


def test_a_dense_model_has_no_expert_inputs_to_offload():
    plan = dataclasses.replace(_plan(ep=1), offload_modules=("expert_fc1",))
    reasons = check_plan(plan, load_model("llama3-8b"), make_cluster(num_gpus=16, gpu="h100-sxm"))
    assert any("has no MoE layers" in r for r in reasons)


def test_estimate_takes_the_flag_and_refuses_an_unpriced_module(capsys):
    base = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "gb200", "--ep", "8"]
    base += ["--framework", "megatron", "--sharding", "zero1", "--global-batch", "128", "--seq-len", "4096"]
    code, out, _ = run_cli(capsys, *base, "--offload-modules", "expert_fc1", "moe_act")
    assert code == 0 and "offload[expert_fc1+moe_act]" in out
    code, _, err = run_cli(capsys, *base, "--offload-modules", "core_attn")
    assert code == 2 and "does not price" in one_line(err)


def test_layer_level_offload_is_timed_over_the_same_link():
    """Megatron's --cpu-offloading-num-layers moves whole layers: over GB200's C2C they hide behind the
    layer's compute (NeMo's 70B GB200 recipe offloads 40), over a PCIe host they do not."""
    llama = load_model("llama3-70b")
    plan = ParallelPlan(
        framework="megatron", dp=64, micro_batch=2, global_batch=128, seq_len=8192, sharding="fsdp-full"
    )
    offloaded = dataclasses.replace(plan, offload_activation_layers=40)
    for gpu, hidden in (("gb200", True), ("b200", False)):
        cluster = make_cluster(num_gpus=64, gpu=gpu)
        a, b = estimate(llama, cluster, plan), estimate(llama, cluster, offloaded)
        assert (b.time.offload_s == a.time.offload_s) == hidden
        assert b.memory.activations_bytes < a.memory.activations_bytes


def test_recompute_never_buys_time_back_from_the_copies_and_the_host_sync_twice():
    """Each of the copy waits and the MoE host sync was hidden against the block's device time on its own,
    so a recompute that lengthens the backward hid both: a copy-bound Qwen1.5-MoE step priced 54.52 s
    without recompute and 54.16 s with it. The host issues on while the device waits for a copy, and DP
    traffic runs through both waits: the recompute now costs time or, copy-bound, nothing."""
    model, cluster = load_model("qwen1.5-moe-a2.7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    plan = ParallelPlan(
        dp=4,
        cp=2,
        micro_batch=2,
        global_batch=1024,
        seq_len=4096,
        framework="megatron",
        offload_modules=("expert_fc1", "moe_act"),
    )
    none, selective = (estimate(model, cluster, plan.replace(recompute=r)) for r in ("none", "selective"))
    assert none.time.offload_s > 0.3 * none.step_time_s  # copy-bound
    assert selective.step_time_s >= none.step_time_s * (1 - 1e-12)
