"""Megatron's fused loss, ``--loss-kernel fused``: Transformer Engine's ``parallel_cross_entropy``
(``--cross-entropy-loss-fusion --cross-entropy-fusion-impl te``), which Megatron-Bridge's performance recipes
run: it keeps the bf16 logits (no fp32 softmax), writes the gradient into them, and moves 12 B per logit."""

from __future__ import annotations

import pytest

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.activations import Kernels, LayerShape, kernels_for
from autotune.costmodel.estimate import estimate
from autotune.costmodel.lossbytes import (
    MEGATRON_LOSS_BYTES_PER_VOCAB,
    TE_LOSS_BYTES_PER_VOCAB,
    loss_bytes_per_vocab,
)
from autotune.costmodel.lossmemory import loss_stored_bytes, loss_transient_bytes
from autotune.emit.megatron import megatron_args_text
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from tests.emit.megatron_flags import megatron_parser

MODEL = load_model("llama3-8b")


def _plan(**kw):
    base = dict(tp=2, dp=4, global_batch=64, seq_len=8192, framework="megatron", sharding="zero1")
    return ParallelPlan(**{**base, **kw})


def test_the_te_loss_keeps_the_bf16_logits_and_writes_its_gradient_into_them():
    plan = _plan(loss_kernel="fused")
    k = kernels_for(plan)
    assert k.te_cross_entropy and not k.compiled_loss
    x = LayerShape.of(MODEL, plan)
    per_set = x.s * x.b * x.vocab / plan.tp
    assert loss_stored_bytes(x, tp=plan.tp, e=2, k=k) == per_set * 2
    assert loss_transient_bytes(x, tp=plan.tp, e=2, k=k) == 0.0
    native = kernels_for(_plan())
    assert loss_stored_bytes(x, tp=plan.tp, e=2, k=native) == per_set * 4  # the fp32 softmax
    assert loss_transient_bytes(x, tp=plan.tp, e=2, k=native) > 0


def test_it_lowers_the_last_stages_peak_and_the_loss_traffic():
    cluster = make_cluster(num_gpus=8)
    native, te = (estimate(MODEL, cluster, _plan(loss_kernel=k)) for k in ("fp32", "fused"))
    saved = native.memory.logits_bytes - te.memory.logits_bytes
    x = LayerShape.of(MODEL, _plan())
    assert saved >= x.s * x.b * x.vocab / 2 * 2  # at least the 2 B per logit of the fp32 softmax
    assert te.memory_bytes_per_gpu < native.memory_bytes_per_gpu
    assert loss_bytes_per_vocab(_plan(loss_kernel="fused")) == TE_LOSS_BYTES_PER_VOCAB
    assert loss_bytes_per_vocab(_plan()) == MEGATRON_LOSS_BYTES_PER_VOCAB
    assert te.step_time_s < native.step_time_s


def test_megatron_args_turn_on_the_te_loss():
    text = megatron_args_text(_plan(loss_kernel="fused"), MODEL)
    args, _ = megatron_parser().parse_known_args(text.split())
    assert args.cross_entropy_loss_fusion and args.cross_entropy_fusion_impl == "te"
    plain, _ = megatron_parser().parse_known_args(megatron_args_text(_plan(), MODEL).split())
    assert not plain.cross_entropy_loss_fusion


def test_the_summary_says_newer_megatron_refuses_it(tmp_path):
    """Megatron-LM core_v0.19 asserts against TE's cross-entropy (arguments.py: "disabled due to stability
    issues"); the summary says what to do there."""
    from autotune.emit import emit_all

    emit_all(_plan(loss_kernel="fused"), MODEL, make_cluster(num_gpus=8), None, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "core_v0.19 refuses it" in summary and "--loss-kernel fp32" in summary


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(loss_kernel="bf16"), "--loss-kernel bf16 needs --framework fsdp"),
        (dict(loss_kernel="chunked"), "--loss-kernel chunked needs --framework fsdp"),
        (dict(loss_kernel="fused", weight_dtype="bf16"), "--weight-dtype bf16 needs --framework fsdp"),
        (dict(loss_kernel="fused", framework="deepspeed"), "--loss-kernel fused needs --framework fsdp"),
    ],
)
def test_other_loss_kernels_stay_framework_fsdps(changes, message):
    with pytest.raises(ConfigError, match=message):
        _plan(**changes)


def test_kernels_without_the_te_loss_are_unchanged():
    assert Kernels().te_cross_entropy is False
    assert not kernels_for(
        _plan(framework="fsdp", sharding="fsdp-full", loss_kernel="fused")
    ).te_cross_entropy
