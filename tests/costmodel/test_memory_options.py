"""Memory options that real recipes use: the allocated-vs-reserved verdict, Megatron's activation CPU
offload and its precision-aware optimizer (16-bit master remainders), and the flags they emit."""

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate
from autotune.costmodel.activations import (
    LayerShape,
    kernels_for,
    layer_activation_bytes,
)
from autotune.costmodel.lossmemory import loss_stored_bytes, loss_transient_bytes
from autotune.costmodel.memory import memory_breakdown
from autotune.costmodel.reserve import FRAGMENTATION_FRACTION
from autotune.emit import megatron_args
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan

GIB = 1024**3


def _fsdp70b(**changes) -> ParallelPlan:
    base = dict(
        framework="megatron",
        dp=64,
        micro_batch=1,
        global_batch=128,
        seq_len=8192,
        sharding="fsdp-full",
        precision="fp8",
    )
    return ParallelPlan(**{**base, **changes})


def test_out_of_memory_is_judged_on_the_allocated_peak():
    """NeMo 25.04's Llama-3-70B on 64 GB200 (Megatron-FSDP, TP1, no recompute) ran: its reserved peak passes
    the device, its allocated peak does not, and estimate keeps it feasible."""
    model, plan = load_model("llama3-70b"), _fsdp70b()
    est = estimate(model, make_cluster(gpu="gb200", num_gpus=64), plan)
    mem = est.memory
    assert mem.fragmentation_bytes > 0
    assert mem.needed_bytes == pytest.approx(mem.total_bytes - mem.fragmentation_bytes)
    assert mem.needed_bytes < est.memory_capacity_bytes < mem.total_bytes
    assert est.feasible and not est.out_of_memory
    small = estimate(model, make_cluster(gpu="h100-sxm", num_gpus=64), plan)
    assert small.out_of_memory and any("allocated" in r for r in small.reasons)


def test_slack_is_the_documented_share_of_what_comes_and_goes():
    mem = memory_breakdown(load_model("llama3-70b"), make_cluster(gpu="gb200", num_gpus=64), _fsdp70b())
    transient = mem.activations_bytes + mem.logits_bytes + mem.prefetch_bytes + mem.comm_buffer_bytes
    assert mem.fragmentation_bytes == pytest.approx(FRAGMENTATION_FRACTION * transient, rel=0.05)


def test_activation_offload_keeps_all_but_n_minus_one_layers_and_uses_host_memory():
    model, cluster = load_model("llama3-70b"), make_cluster(gpu="gb200", num_gpus=64)
    plan = _fsdp70b(micro_batch=2, global_batch=256)
    off = plan.replace(offload_activation_layers=40)
    base, less = memory_breakdown(model, cluster, plan), memory_breakdown(model, cluster, off)
    x = LayerShape.of(model, plan)
    layer = layer_activation_bytes(x, tp=1, sp=False, recompute=plan.recompute, e=2, k=kernels_for(plan))
    assert base.activations_bytes - less.activations_bytes == pytest.approx(39 * layer)
    assert less.host_bytes_per_node == pytest.approx(base.host_bytes_per_node + 40 * layer * 4)


def test_activation_offload_is_a_megatron_option_without_pipelining():
    with pytest.raises(ConfigError, match="offload-activation-layers"):
        _fsdp70b(offload_activation_layers=4, framework="fsdp")
    with pytest.raises(ConfigError, match="offload-activation-layers"):
        ParallelPlan(
            framework="megatron",
            pp=2,
            dp=4,
            global_batch=8,
            seq_len=4096,
            sharding="zero1",
            offload_activation_layers=2,
        )
    with pytest.raises(ConfigError, match="needs --recompute none"):  # TransformerConfig raises it too
        _fsdp70b(offload_activation_layers=40, recompute="selective")
    args = megatron_args(_fsdp70b(offload_activation_layers=40), load_model("llama3-70b"))
    # Megatron-LM 0.16.1 has no --cpu-offloading flag (argparse refuses it): validate_args turns it on from N
    assert ["--cpu-offloading-num-layers", "40"] in args and ["--cpu-offloading"] not in args
    with pytest.raises(ConfigError, match="cpu-offloading-num-layers"):
        megatron_args(_fsdp70b(offload_activation_layers=80), load_model("llama3-70b"))


def test_precision_aware_optimizer_keeps_16_bit_master_remainders():
    """NeMo 24.07's Llama-2-70B SFT on 16 H100 (TP4 PP4, DP 1): 12 -> 10 B of optimizer state per
    parameter is what brings it under 80 GB."""
    model, cluster = load_model("70b"), make_cluster(gpu="h100-sxm", num_gpus=16)
    plan = ParallelPlan(
        framework="megatron",
        tp=4,
        pp=4,
        dp=1,
        global_batch=32,
        seq_len=4096,
        sequence_parallel=True,
        precision="fp8",
    )
    aware = plan.replace(precision_aware_optimizer=True)
    base, less = memory_breakdown(model, cluster, plan), memory_breakdown(model, cluster, aware)
    assert less.optimizer_bytes == pytest.approx(base.optimizer_bytes * 10 / 12)
    assert estimate(model, cluster, plan).out_of_memory
    assert not estimate(model, cluster, aware).out_of_memory
    args = megatron_args(aware, model)
    assert ["--use-precision-aware-optimizer"] in args and ["--use-distributed-optimizer"] in args
    with pytest.raises(ConfigError, match="precision-aware-optimizer"):
        ParallelPlan(framework="megatron", dp=4, global_batch=8, seq_len=4096, precision_aware_optimizer=True)


def test_bf16_grad_reduce_halves_megatron_gradients_and_their_reduction():
    """Megatron-Bridge's gpt-oss perf recipes set ``grad_reduce_in_fp32 = False`` for bf16: the main_grad
    buffer and the DP reduce-scatter are bf16 (--grad-reduce-in-bf16); fp8 plans default to it."""
    from autotune.costmodel.dpcomm import dp_comm_s

    model, cluster = load_model("llama3-8b"), make_cluster(gpu="h100-sxm", num_gpus=64)
    plan = ParallelPlan(framework="megatron", dp=64, global_batch=128, seq_len=4096, sharding="zero1")
    bf16 = plan.replace(grad_reduce_dtype="bf16")
    base, half = memory_breakdown(model, cluster, plan), memory_breakdown(model, cluster, bf16)
    assert half.gradients_bytes == pytest.approx(base.gradients_bytes / 2)
    fp32_s, bf16_s = (sum(dp_comm_s(cluster, model, p, 1e9, 32)) for p in (plan, bf16))
    assert bf16_s < fp32_s
    assert ["--grad-reduce-in-bf16"] in megatron_args(bf16, model)
    assert ["--grad-reduce-in-bf16"] not in megatron_args(plan, model)
    fp8 = plan.replace(precision="fp8")
    assert ["--grad-reduce-in-bf16"] in megatron_args(fp8, model)
    assert ["--grad-reduce-in-bf16"] not in megatron_args(fp8.replace(grad_reduce_dtype="fp32"), model)
    assert (
        memory_breakdown(model, cluster, fp8.replace(grad_reduce_dtype="fp32")).gradients_bytes
        > memory_breakdown(model, cluster, fp8).gradients_bytes
    )
    with pytest.raises(ConfigError, match="grad-reduce-dtype"):
        ParallelPlan(dp=8, global_batch=8, seq_len=4096, sharding="fsdp-full", grad_reduce_dtype="bf16")
    with pytest.raises(ConfigError, match="grad_reduce_dtype"):
        ParallelPlan.from_dict(
            {"global_batch": 8, "seq_len": 4096, "framework": "megatron", "grad_reduce_dtype": "fp16"}
        )


def test_torchtitan_compile_keeps_compute_dtype_logits_for_its_loss():
    """torchtitan compiles the loss with the model: 2 B stored + 2 B gradient per logit instead of the eager
    4 + 8 (benchmarks/results/compiled_loss_saved.json); with TP the loss_parallel path is kept."""
    model, cluster = load_model("llama3-8b"), make_cluster(gpu="h200", num_gpus=32)
    plan = ParallelPlan(
        dp=32, micro_batch=2, global_batch=64, seq_len=8192, sharding="fsdp-full", recompute="selective"
    )
    eager, compiled = (memory_breakdown(model, cluster, p) for p in (plan, plan.replace(compile=True)))
    logits = 2 * 8192 * model.vocab_size
    assert eager.logits_bytes == pytest.approx(12 * logits)  # the loss is the eager peak
    x, k = LayerShape.of(model, plan), kernels_for(plan.replace(compile=True))
    assert loss_stored_bytes(x, tp=1, e=2, k=k) + loss_transient_bytes(x, tp=1, e=2, k=k) == 4 * logits
    assert compiled.total_bytes < eager.total_bytes - 7 * logits
    assert not kernels_for(plan.replace(compile=True, tp=2, dp=16, sequence_parallel=True)).compiled_loss


def test_torch_tp_saves_the_gathered_input_of_the_output_layer():
    from autotune.costmodel.activations import head_activation_bytes

    model = load_model("llama3-70b")
    plans = [
        ParallelPlan(
            framework=fw, tp=8, dp=4, global_batch=4, seq_len=8192, sequence_parallel=True, sharding=sh
        )
        for fw, sh in (("fsdp", "fsdp-full"), ("megatron", "zero1"))
    ]
    x = LayerShape.of(model, plans[0])
    torch_tp, megatron = (
        head_activation_bytes(x, tp=8, sp=True, e=2, k=kernels_for(p), first=False, last=True) for p in plans
    )
    sbh = 8192 * model.hidden_size
    assert torch_tp == pytest.approx(2 * sbh * (1 / 8 + 1)) and megatron == pytest.approx(2 * sbh * 2 / 8)
