"""Stored dtypes of a framework fsdp plan (``weight_dtype``, ``adam_dtype``, ``loss_kernel``): what NeMo
AutoModel's benchmark recipes run (a bf16 model, ``torch.optim.Adam``, ``MaskedCrossEntropy(fp32_upcast=
False)``) priced as such, refused where a framework cannot run it, and the same on every searched plan."""

import pytest
import torch

from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.costmodel import estimate
from autotune.costmodel.activations import LayerShape, kernels_for
from autotune.costmodel.lossmemory import loss_stored_bytes, loss_transient_bytes
from autotune.costmodel.offload import gpu_optimizer_bytes_per_param
from autotune.costmodel.states import MIXED_BF16, state_bytes_per_param
from autotune.emit import torchtitan_unsupported
from autotune.errors import ConfigError, TrialError
from autotune.plan import LossKernel, ParallelPlan, StoreDtype

GIB = 1024**3


def _plan(**changes) -> ParallelPlan:
    base = dict(dp=8, micro_batch=2, global_batch=64, seq_len=4096, sharding="fsdp-full", recompute="full")
    return ParallelPlan(**{**base, **changes})


def test_bf16_weights_store_parameters_gradients_and_moments_in_two_bytes():
    """FSDP2 keeps the sharded gradient in the parameter's dtype and torch.optim.Adam its moments (torch 2.13,
    gloo: both bf16 for a bf16 model); TE FusedAdam's default fp32 moments are ``adam_dtype`` fp32."""
    fp32 = state_bytes_per_param(_plan(), MIXED_BF16)
    bf16 = state_bytes_per_param(_plan(weight_dtype="bf16"), MIXED_BF16)
    te_adam = state_bytes_per_param(_plan(weight_dtype="bf16", adam_dtype="fp32"), MIXED_BF16)
    assert (fp32.weight, fp32.grad, fp32.optimizer) == (4.0, 4.0, 8.0)
    assert (bf16.weight, bf16.grad, bf16.optimizer) == (2.0, 2.0, 4.0)
    assert (te_adam.weight, te_adam.grad, te_adam.optimizer) == (2.0, 2.0, 8.0)
    ddp = state_bytes_per_param(_plan(sharding="none", weight_dtype="bf16"), MIXED_BF16)
    assert ddp.unsharded_copy == 0.0  # no autocast copy of weights that are already bf16
    assert state_bytes_per_param(_plan(sharding="none"), MIXED_BF16).unsharded_copy == 2.0
    assert gpu_optimizer_bytes_per_param(_plan(weight_dtype="bf16")) == 16.0
    assert gpu_optimizer_bytes_per_param(_plan(weight_dtype="bf16", adam_dtype="fp32")) == 24.0
    assert gpu_optimizer_bytes_per_param(_plan()) == 34.0
    assert gpu_optimizer_bytes_per_param(_plan(adam_dtype="bf16")) == 24.0


@pytest.mark.parametrize("loss_kernel", ["fp32", "bf16"])
def test_the_eager_loss_peak_matches_torchs_memtracker(loss_kernel):
    """benchmarks/loss_dtype_memory.py measures 12 B per logit with the fp32 upcast, 6 without."""
    from benchmarks.loss_dtype_memory import measure

    measured = measure(upcast=loss_kernel == "fp32", tokens=256, vocab=4096)["loss"]
    plan = _plan(loss_kernel=loss_kernel)
    model = load_model("llama3-8b")
    x, k = LayerShape.of(model, plan), kernels_for(plan)
    per_logit = (loss_stored_bytes(x, tp=1, e=2, k=k) + loss_transient_bytes(x, tp=1, e=2, k=k)) / (
        x.s * x.b * x.vocab
    )
    assert per_logit == pytest.approx(measured, rel=0.01)


def test_automodels_qwen3_moe_layout_fits_as_it_ran():
    """NeMo AutoModel's Qwen3-30B-A3B on 8 H100 (EP8, FSDP8, local batch 4 x 4096, full AC; docs/
    performance-summary.mdx, 12,040 tok/s/GPU) ran on 80 GB with a bf16 model and a bf16 loss; priced with
    fp32 masters and an fp32 loss it was called out of memory."""
    model, cluster = load_model("qwen3-30b-a3b"), make_cluster(num_gpus=8)
    plan = _plan(ep=8, micro_batch=4, global_batch=512, moe_dispatcher="deepep")
    assert not estimate(model, cluster, plan).feasible
    est = estimate(model, cluster, plan.replace(weight_dtype="bf16", loss_kernel="bf16"))
    assert est.feasible
    states = est.memory.weights_bytes + est.memory.gradients_bytes + est.memory.optimizer_bytes
    assert states == pytest.approx(model.total_params * 8 / 8, rel=0.02)  # 2 + 2 + 4 B over 8 ranks
    assert est.memory_bytes_per_gpu < 60 * GIB


def test_frameworks_that_keep_fp32_masters_refuse_bf16_stores():
    with pytest.raises(ConfigError, match="--weight-dtype bf16 needs --framework fsdp"):
        _plan(framework="megatron", sharding="zero1", weight_dtype="bf16")
    with pytest.raises(ConfigError, match="--loss-kernel bf16 needs --precision bf16 or fp8"):
        _plan(precision="fp16", loss_kernel="bf16")
    assert ParallelPlan.from_dict(_plan(adam_dtype="bf16").to_dict()).moment_dtype is StoreDtype.BF16
    reasons = torchtitan_unsupported(_plan(weight_dtype="bf16", loss_kernel="bf16"))
    assert any("fp32 weights" in r for r in reasons) and any("upcasts the logits" in r for r in reasons)


def test_a_search_puts_the_users_stored_dtypes_on_every_plan():
    from autotune.ranking import plan_search
    from autotune.space import load_space

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    stored = {"weight_dtype": "bf16", "adam_dtype": None, "loss_kernel": "bf16"}
    ranking = plan_search(
        load_space(), model, cluster, pins={"pp": 1}, global_batch=64, seq_len=4096, stored=stored
    )
    plans = [r.plan for r in ranking.feasible]
    assert plans and all(
        p.weight_dtype is StoreDtype.BF16 and p.loss_kernel is LossKernel.BF16 for p in plans
    )
    assert {str(p.framework) for p in plans} == {"fsdp"}
    assert any(r.startswith("bf16 weights or moments, or a loss kernel") for r in ranking.pruned)


def test_trials_run_bf16_stores_on_a_gpu_only(tmp_path, capsys):
    from autotune.trials.train import check_stored_dtypes, lm_loss

    cpu = torch.device("cpu")
    with pytest.raises(TrialError, match="CPU trials train in fp32"):
        check_stored_dtypes(_plan(weight_dtype="bf16"), cpu, workload=False)
    with pytest.raises(TrialError, match="moments like the weights"):
        te_adam = _plan(weight_dtype="bf16", adam_dtype="fp32")
        check_stored_dtypes(te_adam, torch.device("cuda"), workload=False)
    check_stored_dtypes(_plan(), cpu, workload=False)
    logits = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    targets = torch.randint(0, 32, (2, 8))
    assert lm_loss(logits, targets, upcast=False).dtype == torch.bfloat16
    assert lm_loss(logits, targets).dtype == torch.float32
    args = ["search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--backend", "torchrun"]
    assert main([*args, "--weight-dtype", "bf16", "--out", str(tmp_path)]) == 2
    assert "cannot run in CPU trials (fp32)" in capsys.readouterr().err


def test_the_flags_reach_estimate_and_the_emitted_summary(capsys, tmp_path):
    import json

    args = ["--model", "llama3-8b", "--gpus", "8", "--sharding", "fsdp-full", "--weight-dtype", "bf16"]
    assert main(["estimate", *args, "--loss-kernel", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["plan"]["weight_dtype"], out["plan"]["adam_dtype"], out["plan"]["loss_kernel"]) == (
        "bf16",
        None,
        "bf16",
    )
    assert main(["estimate", *args, "--framework", "deepspeed"]) == 2
    assert "weight-dtype bf16 needs --framework fsdp" in capsys.readouterr().err
    search = ["search", *args, "--backend", "simulate", "--out", str(tmp_path), "--pp", "1", "--tp", "1"]
    assert main(search) == 0
    (summary,) = tmp_path.glob("*/best/summary.md")
    assert "build the model in bf16 (torch_dtype=torch.bfloat16, no master)" in summary.read_text()
    assert "weights:bf16" in capsys.readouterr().out


def test_a_fused_loss_kernel_lets_llm_foundrys_small_models_fit_as_they_ran():
    """llm-foundry's H100 table (scripts/train/benchmarking/README.md) ran MPT-760M at 24 x 2048 tokens a GPU
    without recompute under its default ``loss_fn: fused_crossentropy`` (flash-attn's Triton kernel: bf16
    logits kept, one bf16 gradient); with the eager fp32 loss's 12 B per logit it was called out of memory."""
    from autotune.catalog import model_from_dict

    shape = {"model_type": "gpt2", "hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 12}
    model = model_from_dict({**shape, "vocab_size": 50368, "tie_word_embeddings": True}, name="mpt-760m")
    cluster = make_cluster(num_gpus=8)
    plan = ParallelPlan(dp=8, micro_batch=24, global_batch=384, seq_len=2048, sharding="fsdp-full")
    eager, fused = (estimate(model, cluster, plan.replace(loss_kernel=k)) for k in ("fp32", "fused"))
    logits = 24 * 2048 * 50368
    assert not eager.feasible and eager.memory.logits_bytes == pytest.approx(12 * logits)
    assert fused.feasible and fused.memory.logits_bytes == pytest.approx(4 * logits)
    assert fused.step_time_s < eager.step_time_s  # 26 B per logit of eager fp32 traffic gone


def test_a_joining_worker_rebuilds_the_studys_numerics(tmp_path):
    """A worker that joins a study (``autotune worker``) ranks its plans with the creator's stored dtypes and
    loss kernel, read back from the study's own description."""
    from autotune.join import join_study

    runs = tmp_path / "runs"
    argv = ["search", "--model", "7b", "--gpus", "8", "--global-batch", "64", "--backend", "simulate"]
    argv += ["--weight-dtype", "bf16", "--loss-kernel", "fused", "--study", "s", "--out", str(runs)]
    assert main([*argv, "--create-only"]) == 0
    joined = join_study("s", None, runs, heartbeat_s=None)
    ctx = joined.ranking.ctx
    assert (ctx.weight_dtype, ctx.loss_kernel) == (StoreDtype.BF16, LossKernel.FUSED)
    assert joined.ranking.feasible and all(
        r.plan.weight_dtype is StoreDtype.BF16 and r.plan.loss_kernel is LossKernel.FUSED
        for r in joined.ranking.feasible
    )


def test_a_fused_loss_plan_leaves_autotunes_trainer_out_of_what_is_emitted(tmp_path):
    from autotune.emit import emit_all

    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=8)
    emit_all(_plan(loss_kernel="fused"), model, cluster, None, tmp_path)
    assert not (tmp_path / "torchrun_args.txt").exists() and not (tmp_path / "trial").exists()
    assert "trial/plan.json" not in (tmp_path / "pytorchjob.yaml").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "not a fused kernel" in summary and "launch_torchrun.sh (your train.py) or accelerate" in summary
    emit_all(_plan(loss_kernel="bf16"), model, cluster, None, tmp_path / "bf16")
    assert (tmp_path / "bf16" / "trial" / "plan.json").exists()


def test_a_chunked_linear_cross_entropy_keeps_no_logits():
    """Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py): chunks of
    ``next_power_of_2(cdiv(BT, cdiv(V, H)))`` tokens (512 of 16k at Llama 3 8B's 4096 x 128,256), both head
    gradients made in forward, the weight's kept until backward; it takes the whole vocabulary (TP 1)."""
    from autotune.costmodel.lossmemory import liger_chunk_tokens

    model = load_model("llama3-8b")
    plan = _plan(micro_batch=4, loss_kernel="chunked")
    x, k = LayerShape.of(model, plan), kernels_for(plan)
    assert liger_chunk_tokens(4 * 4096, 4096, 128256) == 512
    assert loss_stored_bytes(x, tp=1, e=2, k=k) == 128256 * 4096 * 2
    assert loss_transient_bytes(x, tp=1, e=2, k=k) == 512 * 128256 * 2
    eager = kernels_for(_plan(micro_batch=4))
    assert loss_transient_bytes(x, tp=1, e=2, k=eager) > 50 * loss_transient_bytes(x, tp=1, e=2, k=k)
    with pytest.raises(ConfigError, match="--loss-kernel chunked needs --tp 1"):
        _plan(tp=2, dp=4, loss_kernel="chunked")
