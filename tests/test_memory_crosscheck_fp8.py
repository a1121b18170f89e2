"""The fp8 half of the GPU memory check (``benchmarks/memory_crosscheck.py --gpu --gpu-model 8b-fp8``):
its cases are the plans the model prices, and its float8 swap is torchtitan's, so a GPU session can run it
unchanged. The swap itself runs torchao's float8 (the ``test`` extra installs it), checked on the CPU in
emulation."""

import dataclasses

import pytest
import torch

from autotune.costmodel.activations import Kernels
from autotune.costmodel.states import MIXED_BF16
from autotune.plan import Precision
from benchmarks import memory_crosscheck_gpu as mg
from benchmarks._crosscheck_models import GPU_MODEL
from benchmarks.memory_crosscheck import predict


def test_the_fp8_cases_are_priced_as_fp8_plans_of_each_torchao_recipe():
    cases = mg.gpu_cases_8b_fp8()
    assert {(str(c.plan.fp8_recipe), c.plan.recompute.value) for c in cases} == {
        (r, rc) for r in mg.FP8_RECIPES for rc in ("none", "full")
    }
    for case in cases:
        assert case.plan.precision is Precision.FP8
        mem = predict(case, MIXED_BF16, Kernels(fused_norm=True), gpu="h200")
        assert 0 < mem.total_bytes < 141e9, case.name


def test_float8_swap_leaves_the_head_in_bf16_and_trains():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    from autotune.trials.model import Transformer

    spec = dataclasses.replace(GPU_MODEL, num_layers=1)
    model = mg.float8_linears(Transformer(spec), "tensorwise", emulate=True)
    swapped = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped and all(name.startswith("layers.") for name in swapped)
    assert not isinstance(model.lm_head, Float8Linear)
    ids = torch.randint(spec.vocab_size, (1, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids).float().sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
