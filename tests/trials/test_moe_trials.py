"""The MoE trial workload: the layer computes what its definition says, and every expert-parallel layout
trains like one process.

Parity: each layout runs as a real trial (torchrun, gloo) of ``tiny-moe`` (8 experts, top-2, a shared expert,
layer 0 dense) and its loss at each of three steps must equal a single-process run of the same weights and
data within 1e-4 relative, as tests/trials/test_correctness.py asks of the dense layouts; the parameters
after one optimizer step are compared on ranks spawned by tests/distributed.py.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
import torch.nn.functional as F
from distributed import run_on_ranks
from trial_helpers import LR, MEASURE, SEED, WARMUP, make_request, reference_losses

from autotune.backends.deepspeed import DeepSpeedBackend
from autotune.backends.torchrun import TorchrunBackend
from autotune.catalog import load_model
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ModelSpec
from autotune.trials.config import TrialConfig
from autotune.trials.model import build_model, synthetic_batch
from autotune.trials.moe import load_balancing_loss
from autotune.trials.result import TrialStatus

REL_TOL = 1e-4
SEQ = 32


@pytest.fixture(scope="module")
def tiny_moe() -> ModelSpec:
    return load_model("tiny-moe")


def test_the_model_has_the_parameters_the_spec_counts(tiny_moe):
    net = build_model(tiny_moe, device="cpu", seed=0)
    assert sum(p.numel() for p in net.parameters()) == tiny_moe.num_params
    kinds = [type(block.mlp).__name__ for block in net.layers.values()]
    assert kinds == ["MLP", "MoE", "MoE", "MoE"]  # mlp_only_layers: [0]


def test_moe_layer_is_the_gate_weighted_sum_of_its_top_k_experts(tiny_moe):
    """Sorting, grouping and scatter-back against one token at a time, written from the definition."""
    moe = build_model(tiny_moe, device="cpu", seed=3).layers["1"].mlp
    x = torch.randn(2, 7, tiny_moe.hidden_size)
    tokens = x.reshape(-1, x.shape[-1])
    logits = tokens @ moe.router.gate.weight.T
    ex = moe.experts
    expected = moe.shared_expert(tokens)
    for i, t in enumerate(tokens):
        top = logits[i].topk(tiny_moe.experts_per_token)
        gates = top.values.softmax(-1)  # Mixtral: softmax over the top-k logits
        for g, e in zip(gates, top.indices, strict=True):
            expected[i] += g * ((F.silu(t @ ex.gate_proj[e]) * (t @ ex.up_proj[e])) @ ex.down_proj[e])
    assert torch.allclose(moe(x).reshape_as(expected), expected, atol=1e-6)


def test_load_balancing_loss_is_one_when_uniform_and_trains_the_router(tiny_moe):
    tokens, experts, k = 16, 8, 2
    probs = torch.full((tokens, experts), 1 / experts)
    counts = torch.full((experts,), tokens * k // experts)
    assert load_balancing_loss(probs, counts, k).item() == pytest.approx(1.0)

    x = torch.randn(2, 8, tiny_moe.hidden_size)
    plain, balanced = (
        build_model(tiny_moe, device="cpu", seed=0, aux_loss_coef=c).layers["1"].mlp for c in (0.0, 0.1)
    )
    outs = [m(x) for m in (plain, balanced)]
    assert torch.equal(outs[0], outs[1])  # the aux loss changes gradients only
    for y in outs:
        y.sum().backward()
    assert not torch.allclose(plain.router.gate.weight.grad, balanced.router.gate.weight.grad)
    assert torch.equal(plain.experts.up_proj.grad, balanced.experts.up_proj.grad)


# -- parity of expert-parallel layouts with one process ------------------------------------------------------

LAYOUTS: dict[str, dict[str, object]] = {
    "ep2": {"dp": 2, "ep": 2, "sharding": "fsdp-full"},  # 2 ranks, edp 1
    "ep2xdp2": {"dp": 4, "ep": 2, "sharding": "fsdp-full"},  # 4 ranks, edp 2
    "ep2xhsdp2x2+full-ac": {"dp": 4, "ep": 2, "sharding": "hsdp", "hsdp_shard_size": 2, "recompute": "full"},
    "pp2xep2": {"pp": 2, "dp": 2, "ep": 2, "sharding": "fsdp-full"},  # 4 ranks
    "ds-zero3": {"dp": 2, "sharding": "zero3", "framework": "deepspeed"},  # MoE layers under ZeRO-3
}


def _plan(fields: dict[str, object]) -> ParallelPlan:
    plan = ParallelPlan(global_batch=4, seq_len=SEQ, **fields)
    return plan.replace(global_batch=8) if plan.world_size == 4 else plan


@cache
def _reference(model: ModelSpec, global_batch: int) -> tuple[float, ...]:
    return tuple(reference_losses(model, global_batch=global_batch, seq_len=SEQ, steps=WARMUP + MEASURE))


@pytest.mark.slow
@pytest.mark.dist(timeout=150)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_expert_parallel_layout_matches_single_process(layout, tiny_moe, tmp_path):
    plan = _plan(LAYOUTS[layout])
    backend_cls = DeepSpeedBackend if plan.framework is Framework.DEEPSPEED else TorchrunBackend
    backend = backend_cls(device="cpu", seed=SEED, lr=LR)
    result = backend.run(make_request(tiny_moe, plan, tmp_path / layout))

    assert result.status is TrialStatus.OK, result.error
    expected = _reference(tiny_moe, plan.global_batch)
    assert result.extra["losses"] == pytest.approx(list(expected), rel=REL_TOL)
    assert result.mfu > 0 and result.tokens_per_s > 0


@pytest.mark.slow
def test_reference_is_sensitive_to_the_update(tiny_moe):
    """The comparison means something: a frozen model's third loss differs by far more than REL_TOL."""
    trained = _reference(tiny_moe, 4)
    frozen = reference_losses(tiny_moe, global_batch=4, seq_len=SEQ, steps=WARMUP + MEASURE, lr=0.0)
    assert trained[0] == pytest.approx(frozen[0], rel=1e-6)
    assert abs(trained[-1] - frozen[-1]) / frozen[-1] > 20 * REL_TOL


def _grads_of_one_step(
    rank: int, world: int, plan: ParallelPlan, model: ModelSpec
) -> dict[str, torch.Tensor]:
    """This rank's gradients of step 0, as the trainer leaves them for the optimizer (reduced over DP):
    DTensors gathered whole, each expert tensor as its ``E / ep`` local experts keyed by the first one's
    index."""
    from torch.distributed.tensor import DTensor

    from autotune.trials.train import NativeTrainer, dp_rows

    config = TrialConfig(model=model, seed=SEED, lr=LR, device="cpu")
    trainer = NativeTrainer(plan=plan, config=config, device=torch.device("cpu"))
    x, y = synthetic_batch(
        model, batch=plan.global_batch, seq_len=SEQ, step=0, seed=SEED, rows=dp_rows(plan, trainer.dp_rank)
    )
    trainer._step(x, y)
    ep_rank = trainer.expert_mesh.get_local_rank("ep")
    out = {}
    for name, p in trainer.modules[0].named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        if ".experts." in name:
            name = f"{name}@{ep_rank * grad.shape[0]}"
        out[name.replace("_checkpoint_wrapped_module.", "")] = grad.clone()
    return out


@pytest.mark.slow
@pytest.mark.dist(timeout=120)
def test_gradients_match_single_process(tiny_moe):
    """EP 2 x expert-DP 2 on 4 ranks: every gradient, experts included, equals one process's (gradients, not
    the parameters after AdamW: its first step is ~lr x sign(g), which turns reduction-order noise in the
    gradients near zero into lr-sized differences)."""
    plan = _plan(LAYOUTS["ep2xdp2"])
    ranks = run_on_ranks(_grads_of_one_step, 4, plan, tiny_moe)

    net = build_model(tiny_moe, device="cpu", seed=SEED)
    x, y = synthetic_batch(tiny_moe, batch=plan.global_batch, seq_len=SEQ, step=0, seed=SEED)
    F.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()
    worst = 0.0
    for name, p in net.named_parameters():
        if ".experts." in name:
            got = {k: v for r in ranks for k, v in r.items() if k.startswith(name + "@")}
            assert len(got) == 2, name  # two EP ranks, each with half the experts
            views = [torch.cat([got[k] for k in sorted(got, key=lambda k: int(k.split("@")[1]))])]
        else:
            views = [r[name] for r in ranks]
        for g in views:
            worst = max(worst, ((g - p.grad).abs().max() / p.grad.abs().max()).item())
    print(f"worst relative gradient difference {worst:.2e}")
    assert worst < 1e-5, worst  # observed 6.2e-7: reduction order only


def test_trials_refuse_tensor_parallel_moe_layers_with_one_line(tiny_moe):
    from autotune.errors import TrialError
    from autotune.trials.parallelize import parallelize

    net = build_model(tiny_moe, device="meta", seed=None)
    etp = {"tp": 2, "dp": 2, "ep": 2, "etp": 2, "sharding": "fsdp-full"}
    for fields, word in (({"tp": 2}, "TP=1"), (etp, "ETP=1")):
        with pytest.raises(TrialError, match=word):
            parallelize(net, plan=_plan(fields), mesh=None)


@pytest.mark.slow
@pytest.mark.dist(timeout=300)
def test_a_cpu_search_over_an_moe_model_measures_an_expert_parallel_plan(tmp_path):
    """``autotune search`` on tiny-moe with real 2-rank CPU trials: EP is in the space (the bundled
    ``ep: divisors_of_experts``), TP is pinned to 1 for MoE trials, and an EP 2 plan is measured."""
    import contextlib
    import io
    import json

    import optuna

    from autotune.cli import main

    out = io.StringIO()
    argv = [
        "search",
        "--model",
        "tiny-moe",
        "--gpus",
        "2",
        "--gpu",
        "cpu",
        "--device",
        "cpu",
        "--backend",
        "torchrun",
        "--trials",
        "2",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--study",
        "s",
        "--out",
        str(tmp_path),
        "--json",
    ]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    summary = json.loads(out.getvalue())
    assert summary["value_source"] == "measured" and summary["trials"]["failed"] == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    measured = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert len(measured) == 2 and all(t.params["tp"] == 1 for t in measured)
    assert any(t.params["ep"] == 2 for t in measured)
    assert all(t.value > 0 for t in measured)


def test_real_trials_pin_what_moe_trials_cannot_split(tiny_moe):
    from autotune.backends.registry import apply_pins, get_backend
    from autotune.catalog import make_cluster
    from autotune.errors import ConfigError, TrialError
    from autotune.trials.deepspeed_engine import DeepSpeedTrainer

    cluster = make_cluster(num_gpus=2, gpu="cpu")
    choice = get_backend("torchrun", cluster=cluster, device="cpu", model=tiny_moe)
    pinned = {"ep": 2, "cp": 1, "etp": 1, "tp": 1, "moe_dispatcher": "alltoall"}
    assert apply_pins({"ep": 2}, choice) == pinned
    with pytest.raises(ConfigError, match="--tp 2: MoE layers are not tensor-parallel in real trials"):
        apply_pins({"tp": 2}, choice)
    with pytest.raises(ConfigError, match="--moe-dispatcher deepep: the trial MoE exchanges tokens"):
        apply_pins({"moe_dispatcher": "deepep"}, choice)
    plan = _plan({"dp": 2, "ep": 2, "sharding": "zero1", "framework": "deepspeed"})
    with pytest.raises(TrialError, match="DeepSpeed-MoE expert parallelism is not implemented"):
        DeepSpeedTrainer(plan=plan, config=TrialConfig(model=tiny_moe), device=torch.device("cpu"))
