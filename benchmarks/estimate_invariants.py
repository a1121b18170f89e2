"""Laws the estimate must obey, checked over sampled legal plans of every catalog model.

A cost model can be wrong in ways no published row shows: a term that hides twice behind the same compute,
a faster card priced slower. Each law below compares a plan with one changed field whose effect has a known
sign. The plans are a fixed-seed sample of the ladders ``enumeration.enumerate_plans`` yields for each
bundled framework space (fsdp, megatron, deepspeed) on two random catalog GPUs and an H100 SXM per model.

Laws (a violation is a change beyond 0.5 % the wrong way):

- ``imbalance``: a busier EP rank (``moe_load_imbalance`` x1.5) is never faster, never smaller;
- ``recompute``: more recompute (none < selective < full) is never faster, outside the zero-bubble
  schedules, whose weight-gradient pass fills the bubble with the rerun (``steptime._bubble_fraction``),
  and never allocates more, outside GPipe (every micro-batch's forward held at once);
- ``microbatch``: twice the micro-batch (half the micro-batches) never allocates less, outside GPipe under
  PP (the reason below);
- ``offload``: offloading the optimizer never takes more device memory;
- ``overlap``: turning Megatron's DP overlap off is never faster;
- ``knobs``: torch.compile or async TP turned on is never slower; offloading the optimizer never faster;
- ``irrelevant``: a field the plan does not read (the CP exchange at CP 1, the fp8 recipe of a bf16 plan,
  the dispatcher at EP 1, the schedule at PP 1) changes nothing;
- ``batch``: twice the global batch (twice the micro-batches) never lowers tokens/s;
- ``gpu``: an H200 (an H100 SXM's FLOPs with more HBM bandwidth) is never slower than an H100 SXM;
- ``sharding``: sharding more (ZeRO 0 < 1 < 2 < 3; FSDP none < grad-op < full) never allocates more than
  2 % more device memory (the allocated peak, ``MemoryBreakdown.needed_bytes``: under pipelining fsdp-full
  holds what fsdp-grad-op does at the peak, gathered again in backward, and its reserved peak carries the
  allocator slack of that churn, ``reserve.fragmentation_bytes``).

Not laws, and not checked: a larger micro-batch can take less memory under GPipe with FSDP and PP (fewer
micro-batches leave no activations beside the accumulated unsharded gradients, ``deferredreduce``);
TP-comm overlap can be slower at TP 2 (its SMs cost more than it hides, ``compute.ub_sm_margin_s``); TP or CP
taken out of DP can take more memory under GPipe (the replica's micro-batches double).

Usage: python benchmarks/estimate_invariants.py [--seed 0] [--plans 8]
(writes benchmarks/results/estimate_invariants.md)
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root

from autotune.catalog import gpu_names, load_model, make_cluster, model_names  # noqa: E402
from autotune.costmodel import Estimate, estimate  # noqa: E402
from autotune.enumeration import enumerate_plans  # noqa: E402
from autotune.errors import ConfigError  # noqa: E402
from autotune.legality import check_plan  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.render import plan_summary  # noqa: E402
from autotune.space import PlanContext, load_space, resolve_choices  # noqa: E402
from autotune.specs import ClusterSpec, ModelSpec  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "estimate_invariants.md"
TOL = 1.005
SHARDING_ORDER = {
    "deepspeed": ("zero0", "zero1", "zero2", "zero3"),
    "fsdp": ("none", "fsdp-grad-op", "fsdp-full"),
    "megatron": ("none", "zero1"),
}
RECOMPUTE_ORDER = ("none", "selective", "full")
TOY_MODELS = ("tiny", "small", "tiny-moe")
LAWS = (
    "imbalance",
    "recompute",
    "microbatch",
    "offload",
    "overlap",
    "knobs",
    "irrelevant",
    "batch",
    "gpu",
    "sharding",
)


def sample(
    seed: int, plans_per_space: int, models: list[str] | None = None
) -> Iterator[tuple[ModelSpec, ClusterSpec, ParallelPlan]]:
    """(model, cluster, plan) for the fixed-seed sample of the module docstring; ``models``: these catalog
    models only (default: every one but the toy ones)."""
    rng = random.Random(seed)
    gpus = [g for g in gpu_names() if g != "cpu"]
    for name in models or [m for m in model_names() if m not in TOY_MODELS]:
        model = load_model(name)
        for gpu in [*rng.sample(gpus, 2), "h100-sxm"]:
            cluster = make_cluster(num_gpus=rng.choice([8, 16, 64, 256]), gpu=gpu)
            for framework in SHARDING_ORDER:
                seq, gbs = rng.choice([2048, 4096, 8192]), rng.choice([64, 256, 1024])
                try:
                    choices = resolve_choices(load_space(framework), model, cluster)
                    ctx = PlanContext(model=model, cluster=cluster, global_batch=gbs, seq_len=seq)
                    ladders = list(itertools.islice(enumerate_plans(choices, ctx), 3000))
                except ConfigError:
                    continue
                for ladder in rng.sample(ladders, min(plans_per_space, len(ladders))):
                    plan = ParallelPlan(**{**ladder.fields, "micro_batch": rng.choice(ladder.micro_batches)})
                    yield model, cluster, plan


def _variant(
    plan: ParallelPlan, model: ModelSpec, cluster: ClusterSpec, **changes: object
) -> ParallelPlan | None:
    try:
        other = plan.replace(**changes)
    except ConfigError:
        return None
    return None if check_plan(other, model, cluster) else other


def _unread_fields(plan: ParallelPlan) -> list[dict[str, object]]:
    """Changes to fields this plan does not read (``ParallelPlan``'s field docs say when each is read)."""
    out: list[dict[str, object]] = []
    if plan.cp == 1:
        out += [{"cp_comm": "allgather"}, {"cp_comm": "a2a"}]
    if plan.precision.value != "fp8":
        out.append({"fp8_recipe": "rowwise"})
    if plan.ep == 1:
        out.append({"moe_dispatcher": "allgather"})
    if plan.pp == 1:
        out.append({"schedule": "gpipe"})
    return out


def _differs(a: Estimate, b: Estimate) -> bool:
    return not (
        math.isclose(a.step_time_s, b.step_time_s, rel_tol=1e-9)
        and math.isclose(a.memory_bytes_per_gpu, b.memory_bytes_per_gpu, rel_tol=1e-9)
    )


def violations(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan) -> list[tuple[str, str]]:
    """(law, what moved) for every law of the module docstring this plan breaks."""
    base = estimate(model, cluster, plan)
    out: list[tuple[str, str]] = []

    def slower(law: str, other: ParallelPlan | None) -> None:
        if other is not None and (e := estimate(model, cluster, other)).step_time_s * TOL < base.step_time_s:
            out.append((law, f"{base.step_time_s:.4g} -> {e.step_time_s:.4g} s"))

    if model.is_moe and plan.ep > 1:
        other = _variant(plan, model, cluster, moe_load_imbalance=plan.moe_load_imbalance * 1.5)
        slower("imbalance", other)
        if other and estimate(model, cluster, other).memory_bytes_per_gpu * TOL < base.memory_bytes_per_gpu:
            out.append(("imbalance", "less memory"))
    rc = plan.recompute.value
    gpipe = plan.pp > 1 and plan.schedule.value == "gpipe"
    if not plan.recompute_modules and plan.recompute_layers is None:
        for more in RECOMPUTE_ORDER[RECOMPUTE_ORDER.index(rc) + 1 :]:
            if (other := _variant(plan, model, cluster, recompute=more)) is None:
                continue
            e = estimate(model, cluster, other)  # one estimate for both halves of the law
            if not plan.schedule.zero_bubble and e.step_time_s * TOL < base.step_time_s:
                out.append(("recompute", f"{base.step_time_s:.4g} -> {e.step_time_s:.4g} s"))
            if not gpipe and e.memory.needed_bytes > base.memory.needed_bytes * TOL:
                out.append(("recompute", f"{rc} -> {more}: more memory"))
    if not gpipe and (other := _variant(plan, model, cluster, micro_batch=plan.micro_batch * 2)):
        if estimate(model, cluster, other).memory.needed_bytes * TOL < base.memory.needed_bytes:
            out.append(("microbatch", f"mbs {plan.micro_batch} -> {other.micro_batch}: less memory"))
    if not plan.offload and (other := _variant(plan, model, cluster, offload=True)):
        if estimate(model, cluster, other).memory_bytes_per_gpu > base.memory_bytes_per_gpu * TOL:
            out.append(("offload", "more memory"))
    for flag in ("overlap_grad_reduce", "overlap_param_gather"):
        if getattr(plan, flag):
            slower("overlap", _variant(plan, model, cluster, **{flag: False}))
    for knob in ("compile", "async_tp"):
        if not getattr(plan, knob) and (other := _variant(plan, model, cluster, **{knob: True})):
            if (e := estimate(model, cluster, other)).step_time_s > base.step_time_s * TOL:
                out.append(("knobs", f"{knob}: {base.step_time_s:.4g} -> {e.step_time_s:.4g} s"))
    if not plan.offload:
        slower("knobs", _variant(plan, model, cluster, offload=True))
    for unread in _unread_fields(plan):
        other = _variant(plan, model, cluster, **unread)
        if other and _differs(estimate(model, cluster, other), base):
            out.append(("irrelevant", f"{unread} moved the estimate"))
    if other := _variant(plan, model, cluster, global_batch=plan.global_batch * 2):
        if (e := estimate(model, cluster, other)).tokens_per_s * TOL < base.tokens_per_s:
            out.append(("batch", f"{base.tokens_per_s:.4g} -> {e.tokens_per_s:.4g} tokens/s"))
    if cluster.gpu.key == "h100-sxm":
        h200 = make_cluster(num_gpus=cluster.num_gpus, gpu="h200")
        if (
            not check_plan(plan, model, h200)
            and (e := estimate(model, h200, plan)).step_time_s > base.step_time_s * TOL
        ):
            out.append(("gpu", f"{base.step_time_s:.4g} -> {e.step_time_s:.4g} s on h200"))
    order = SHARDING_ORDER[plan.framework.value]
    if plan.sharding.value in order:
        for more in order[order.index(plan.sharding.value) + 1 :]:
            other = _variant(plan, model, cluster, sharding=more)
            if (
                other
                and estimate(model, cluster, other).memory.needed_bytes > 1.02 * base.memory.needed_bytes
            ):
                out.append(("sharding", f"{plan.sharding.value} -> {more}: more memory"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plans", type=int, default=8, help="plans per model x GPU x framework space")
    args = parser.parse_args()
    checked, broken, examples = 0, Counter[str](), {}
    for model, cluster, plan in sample(args.seed, args.plans):
        checked += 1
        for law, what in violations(model, cluster, plan):
            broken[law] += 1
            examples.setdefault(
                law, f"{model.name} on {cluster.num_gpus} {cluster.gpu.key}: {plan_summary(plan)}: {what}"
            )
    lines = [
        "# Laws the estimate must obey",
        "",
        f"Generated by `python benchmarks/estimate_invariants.py --seed {args.seed} --plans {args.plans}` "
        "(the laws and what is not one: the script's docstring).",
        "",
        f"{checked} sampled legal plans; violations: {sum(broken.values())}.",
        "",
        "| law | violations | first example |",
        "|---|---|---|",
        *(f"| {law} | {broken[law]} | {examples.get(law, '')} |" for law in LAWS),
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
