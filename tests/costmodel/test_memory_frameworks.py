"""Memory terms that follow what each framework allocates: torchtitan op SAC and loss parallel,
Transformer Engine fp8 GEMM inputs, Megatron's gradient dtype; pinned to torchtitan's published peaks."""

import json
import math
from pathlib import Path

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.activations import (
    Kernels,
    LayerShape,
    kernels_for,
    layer_activation_bytes,
    op_sac_bytes,
)
from autotune.costmodel.estimate import estimate
from autotune.costmodel.lossmemory import loss_transient_bytes
from autotune.costmodel.reserve import reserve_bytes
from autotune.costmodel.states import MIXED_BF16, state_bytes_per_param
from autotune.plan import ParallelPlan, Recompute

GIB = 1024**3
_8B = {"dp": 8, "micro_batch": 2, "global_batch": 16, "seq_len": 8192, "sharding": "fsdp-full"}


def _layer(plan, model="llama3-8b"):
    x = LayerShape.of(load_model(model), plan)
    return layer_activation_bytes(
        x, tp=plan.tp, sp=plan.sequence_parallel, recompute=plan.recompute, e=2, k=kernels_for(plan)
    )


def test_torchtitan_op_sac_keeps_every_other_matmul_output():
    """q, v, gate, down outputs + block input + SDPA output and log-sum-exp (Llama 3 8B, 2 x 8192 tokens)."""
    plan = ParallelPlan(**_8B, recompute="selective", framework="fsdp")
    h, kv, ffn, heads, tokens = 4096, 1024, 14336, 32, 2 * 8192
    expected = tokens * 2 * (h + h + kv + ffn + h + h) + 4 * heads * tokens
    assert _layer(plan) == expected
    megatron_selective = _layer(plan.replace(framework="megatron", sharding="zero1"))
    assert megatron_selective > 1.8 * expected  # Megatron's selective keeps all but the attention core


def test_transformer_engine_fp8_saves_gemm_inputs_in_one_byte():
    plan = ParallelPlan(dp=8, global_batch=8, seq_len=8192, sharding="zero1", framework="megatron")
    bf16, fp8 = _layer(plan), _layer(plan.replace(precision="fp8"))
    h, ffn, tokens = 4096, 14336, 8192
    # norm outputs (2h) and the FC2 input (ffn) drop to 1 B; the projection's fp8 input (h) is an extra copy
    assert bf16 - fp8 == tokens * (2 * h + ffn - h)


def test_megatron_fp8_reduces_gradients_in_bf16():
    plan = ParallelPlan(dp=8, global_batch=8, seq_len=8192, sharding="zero1", framework="megatron")
    assert state_bytes_per_param(plan, MIXED_BF16).grad == 4.0
    assert state_bytes_per_param(plan.replace(precision="fp8"), MIXED_BF16).grad == 2.0


def test_loss_parallel_holds_four_fp32_logit_buffers():
    model = load_model("llama3-70b")
    plan = ParallelPlan(tp=8, dp=2, global_batch=2, seq_len=8192, sharding="fsdp-full", framework="fsdp")
    x = LayerShape.of(model, plan)
    logits = x.s * x.b * x.vocab / 8
    assert loss_transient_bytes(x, tp=8, e=2, k=kernels_for(plan)) == 12 * logits
    plain = kernels_for(plan.replace(tp=1, dp=16, global_batch=16))
    assert loss_transient_bytes(x, tp=1, e=2, k=plain) == 8 * x.s * x.b * x.vocab


@pytest.mark.parametrize(("gpus", "published_gib"), [(8, 82.4), (128, 67.0)])
def test_torchtitan_llama3_8b_sac_op_peak_within_ten_percent(gpus, published_gib):
    """torchtitan docs/performance.md Tables 1 and 3 (FSDP, local batch 2 x 8192, selective op AC, H100
    96 GB): the allocator's max reserved; the prediction less CUDA context and NCCL."""
    plan = ParallelPlan(**{**_8B, "dp": gpus, "global_batch": 2 * gpus}, recompute=Recompute.SELECTIVE)
    cluster = make_cluster(gpu="h100-96gb", num_gpus=gpus)
    est = estimate(load_model("llama3-8b"), cluster, plan)
    reserved = est.memory_bytes_per_gpu - reserve_bytes(cluster, plan)  # CUDA and NCCL: not in "reserved"
    assert est.feasible
    assert reserved / GIB == pytest.approx(published_gib, rel=0.10)


def test_megatron_fsdp_shards_everything_and_gathers_per_layer():
    """Megatron-FSDP (--use-megatron-fsdp, optim_grads_params), as Megatron-Bridge's Llama 3 recipes
    run it."""
    from autotune.emit.megatron import megatron_args_text

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    base = dict(dp=8, global_batch=8, seq_len=8192, framework="megatron", precision="fp8")
    dist_opt = estimate(model, cluster, ParallelPlan(**base, sharding="zero1")).memory
    fsdp = estimate(model, cluster, ParallelPlan(**base, sharding="fsdp-full")).memory
    assert fsdp.weights_bytes == pytest.approx(dist_opt.weights_bytes / 8)
    assert fsdp.gradients_bytes == pytest.approx(dist_opt.gradients_bytes / 8)
    from autotune.costmodel.dpbuffers import gathered_bytes

    gathered = [
        gathered_bytes(model, ParallelPlan(**base, sharding=s), first=True, last=True, backward=True)
        for s in ("fsdp-full", "zero1")
    ]
    assert gathered[0] > 0 == gathered[1]
    text = megatron_args_text(ParallelPlan(**base, sharding="fsdp-full"), model)
    assert "--use-megatron-fsdp\n" in text
    assert "--data-parallel-sharding-strategy optim_grads_params\n" in text
    with pytest.raises(Exception, match="Megatron-FSDP is priced without pipelining"):
        ParallelPlan(**{**base, "dp": 4}, pp=2, sharding="fsdp-full")


def test_op_sac_keeps_what_the_measured_block_saves_eager_and_compiled():
    """benchmarks/compiled_sac_saved.py: one Llama block under torchtitan's op SAC on CPU (fp32), what
    autograd and the checkpoint keep. Eager keeps q, v, gate and down outputs, the block input, SDPA's output
    and log-sum-exp; compiled, AOTAutograd drops the down projection's output, which no backward reads."""
    saved = json.loads((Path(__file__).parents[2] / "benchmarks/results/compiled_sac_saved.json").read_text())
    d = saved["shape"]
    x = LayerShape(
        s=d["seq"],
        b=d["batch"],
        h=d["hidden"],
        kv=d["hidden"] * d["kv_heads"] // d["heads"],
        ffn=d["ffn"],
        heads=d["heads"],
        vocab=32000,
        gated=True,
    )
    for mode, compiled in (("eager", False), ("compiled", True)):
        measured = 4 * sum(math.prod(t["shape"]) for t in saved[mode]["saved"])
        k = Kernels(op_sac=True, compiled_sac=compiled)
        assert op_sac_bytes(x, tp=1, sp=False, e=4, k=k) == pytest.approx(measured, rel=1e-9), mode
    names = {m: {t["name"] for t in saved[m]["saved"]} for m in ("eager", "compiled")}
    assert names["eager"] - names["compiled"] == {"w2"}


def test_compiled_op_sac_drops_the_down_projection_and_its_scattered_copy():
    plan = ParallelPlan(
        dp=8,
        tp=8,
        micro_batch=1,
        global_batch=8,
        seq_len=8192,
        sharding="fsdp-full",
        recompute="selective",
        framework="fsdp",
        sequence_parallel=True,
    )
    eager, compiled = _layer(plan), _layer(plan.replace(compile=True))
    h, tokens = 4096, 8192
    assert eager - compiled == pytest.approx(tokens * (h + h / 8) * 2)  # partial sums + reduce-scattered
