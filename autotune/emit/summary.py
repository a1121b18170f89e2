"""``summary.md``: what the plan is, what the cost model said, which files were written and how to launch
them, and which artefacts were left out because their framework cannot express the plan (and why)."""

from __future__ import annotations

from typing import Any

from autotune.contract import ENV, SCRIPT_CONFIGS
from autotune.emit.fsdp import transformer_layer_cls
from autotune.emit.megatron import megatron_entry
from autotune.emit.summarynotes import deepspeed_notes, stored_dtype_note
from autotune.emit.torchtitan import REGISTRIES, torchtitan_flavor, torchtitan_model
from autotune.modelshape import trial_model_gap
from autotune.plan import Framework, LossKernel, ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["render_summary"]

_GIB = 1024**3
_PRIMARY = {
    Framework.FSDP: (
        "launch_torchrun.sh",
        "launch_torchrun.sh ({}), torchtitan.toml, accelerate_fsdp.yaml",
    ),
    Framework.DEEPSPEED: ("ds_config.json", "ds_config.json with launch_deepspeed.sh"),
    Framework.MEGATRON: ("megatron_args.txt", "megatron_args.txt"),
}
"""Per framework the plan was priced for: the file that must exist, and what to start with."""
_CONTRACT = {
    "plan": "`trial/plan.json`, the plan (tp, pp, dp, sharding, micro_batch, global_batch, ...)",
    "ds_config": "`ds_config.json` for deepspeed.initialize",
    "accelerate_config": "`accelerate_fsdp.yaml`",
    "trial_dir": "where results go (default `trial/`)",
    "result": "`result.json`, written by contract.report()",
    "progress": "`progress.jsonl`, appended by contract.step()",
}
SCRIPT_CONFIG_KEYS = frozenset(SCRIPT_CONFIGS)
_LAUNCHERS = {
    "launch_torchrun.sh": "on each node `MASTER_ADDR=<first node> bash launch_torchrun.sh train.py [flags]` "
    "(no script: autotune's own trainer).",
    "launch_deepspeed.sh": "`bash launch_deepspeed.sh train.py [flags]` on the first node (others from "
    "`hostfile`); the script also gets `--deepspeed_config`.",
    "launch_slurm.sbatch": "`sbatch path/to/launch_slurm.sbatch train.py [flags]` from any directory (a "
    "relative script path starts there); the job finds this folder through scontrol.",
    "pytorchjob.yaml": "create the ConfigMap its header names, put the script in each replica's `args`, "
    "`autotune emit --image` for your image, then `kubectl apply -f pytorchjob.yaml`.",
}


def primary_file(plan: ParallelPlan) -> str:
    """The file that runs ``plan`` on the framework it was priced for (its launch file or config)."""
    return _PRIMARY[plan.framework][0]


def _priced_for(plan: ParallelPlan, model: ModelSpec, written: set[str]) -> str:
    needed, start = _PRIMARY[plan.framework]
    if needed in written:  # the options that were written, in order
        trainer = "torchrun_args.txt" in written and not trial_model_gap(model)  # else the worker refuses it
        start = start.format("autotune's trainer" if trainer else "your train.py")
        kept = [f for f in start.split(", ") if f.split(" ")[0] in written]
        start = " or ".join([", ".join(kept[:-1]), kept[-1]] if len(kept) > 1 else kept)
        return f"Priced for **{plan.framework}**: start with {start}."
    return (
        f"**Priced for {plan.framework}, but {plan.framework} cannot run this plan** (see Not emitted): "
        "the estimate does not transfer to the files below as is."
    )


def _plan_table(plan: ParallelPlan) -> list[str]:
    sharding = str(plan.sharding)
    if plan.hsdp_shard_size is not None:
        sharding += f" (shard groups of {plan.hsdp_shard_size})"
    schedule = f"{plan.schedule} x {plan.virtual_stages} virtual stage(s)" if plan.pp > 1 else "-"
    rows = [
        ("tensor parallel (TP)", plan.tp),
        ("pipeline parallel (PP)", plan.pp),
        ("data parallel (DP)", plan.dp),
        ("context parallel (CP)", plan.cp),
        ("sharding", sharding),
        ("micro-batch per GPU", plan.micro_batch),
        ("gradient accumulation", plan.grad_accum),
        ("global batch (sequences)", plan.global_batch),
        ("sequence length", plan.seq_len),
        ("recompute", plan.recompute),
        *_memory_rows(plan),
        ("sequence parallel", plan.sequence_parallel),
        ("pipeline schedule", schedule),
        ("optimizer offload", plan.offload),
        ("precision", plan.precision),
        ("framework", plan.framework),
        *_speed_rows(plan),
    ]
    if plan.ep > 1 or plan.etp > 1:
        rows += [("expert parallel (EP)", plan.ep), ("expert tensor parallel (ETP)", plan.etp)]
    return ["| knob | value |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows)]


def _memory_rows(plan: ParallelPlan) -> list[tuple[str, object]]:
    """Megatron's memory options the plan sets (each also a flag in megatron_args.txt)."""
    rows: list[tuple[str, object]] = []
    if plan.recompute_modules:
        rows.append(("recompute modules", " ".join(plan.recompute_modules)))
    if plan.offload_activation_layers:
        rows.append(("activations of layers offloaded", plan.offload_activation_layers))
    if plan.offload_modules:
        rows.append(("activation offload (modules)", " ".join(plan.offload_modules)))
    return rows


def _speed_rows(plan: ParallelPlan) -> list[tuple[str, object]]:
    """The speed knobs that apply to the plan (ParallelPlan's last fields)."""
    rows: list[tuple[str, object]] = []
    if str(plan.precision) == "fp8":
        rows.append(("fp8 recipe", plan.fp8_recipe))
    if str(plan.framework) == "fsdp":
        rows += [("torch.compile", plan.compile), ("async TP", plan.async_tp)]
    if str(plan.framework) == "megatron":
        rows += [
            ("TP-comm overlap", plan.tp_comm_overlap),
            ("DP grad-reduce overlap", plan.overlap_grad_reduce),
            ("DP param-gather overlap", plan.overlap_param_gather),
        ]
        if plan.ep > 1:
            rows.append(("EP all-to-all overlap", plan.moe_a2a_overlap))
    if plan.cp > 1:
        rows.append(("CP exchange", plan.cp_comm))
    return rows


def _estimate_lines(est: dict[str, Any] | None) -> list[str]:
    if est is None:
        return ["No estimate: the cost model was not run for this plan."]
    lines = [f"- feasible: {'yes' if est.get('feasible') else 'no'}"]
    lines += [f"  - {reason}" for reason in est.get("reasons", [])]
    if "memory_bytes_per_gpu" in est:
        cap = est.get("memory_capacity_bytes")
        of = f" of {cap / _GIB:.1f} GiB" if cap else ""
        lines.append(f"- memory per GPU: {est['memory_bytes_per_gpu'] / _GIB:.1f} GiB{of}")
        if cap:
            free = cap - est["memory_bytes_per_gpu"]
            lines.append(
                f"- memory left free: {free / _GIB:.1f} GiB ({free / cap:.0%} of the GPU; "
                "the search keeps at least its --memory-headroom, default 10 %)"
            )
    if "step_time_s" in est:
        lines.append(
            f"- step time: {est['step_time_s']:.3f} s, {est.get('tokens_per_s', 0):,.0f} tokens/s, "
            f"MFU {100 * est.get('mfu', 0):.1f}%, bound by {est.get('bottleneck', '?')}"
        )
    return lines


def _notes(plan: ParallelPlan, model: ModelSpec, written: set[str]) -> list[str]:
    notes = [
        f"- Each data-parallel rank takes {plan.micro_batch} sequence(s) of {plan.seq_len} tokens per "
        f"micro-step, {plan.grad_accum} micro-step(s) per optimizer step ({plan.global_batch} in all)."
    ]
    if model.is_moe and plan.moe_capacity_factor is None and plan.moe_load_imbalance != 1.0:
        notes.append(
            f"- MoE routing priced dropless with the busiest EP rank at {plan.moe_load_imbalance:g}x the "
            "mean load (--moe-load-imbalance): if your router is better or worse balanced, the step time "
            "moves with it."
        )
    if "ds_config.json" in written:
        notes += deepspeed_notes(plan)
        if model.is_moe:  # deepspeed/moe/layer.py: MoE(..., ep_size, k, capacity_factor, drop_tokens=True)
            c = plan.moe_capacity_factor
            routing = (
                "drop_tokens=False) (the plan was priced dropless; DeepSpeed drops by default)."
                if c is None
                else f"capacity_factor={c:g}, drop_tokens=True) (priced padded to that capacity)."
            )
            notes.append(
                f"- DeepSpeed-MoE: expert parallelism is set in the model code, not in ds_config: "
                f"deepspeed.moe.layer.MoE(hidden_size={model.hidden_size}, expert=..., "
                f"num_experts={model.num_experts}, ep_size={plan.ep}, k={model.experts_per_token}, " + routing
            )
    stored = stored_dtype_note(plan)
    if stored:
        notes.append(stored)
    if "accelerate_fsdp.yaml" in written:
        notes.append(
            f"- accelerate: wraps each {transformer_layer_cls(model)}; pass Accelerator("
            f"gradient_accumulation_steps={plan.grad_accum}) and a per-device batch of "
            f"{plan.micro_batch}. Launch on each node: accelerate launch --config_file "
            "accelerate_fsdp.yaml --machine_rank R --main_process_ip HOST --main_process_port PORT "
            "train.py"
        )
        ends = model.vocab_size * model.hidden_size * (1 if model.tie_embeddings else 2) / plan.tp
        notes.append(
            f"- accelerate wraps the blocks, not the ends: the embeddings and head ({ends / 1e9:.2f} B "
            "parameters per GPU) stay in the root FSDP unit, gathered through the whole backward with their "
            f"fp32 gradient, up to {ends * 6 / 2**30:.1f} GiB above the estimate, which prices them as their "
            "own units (as torchtitan and the trials wrap them)."
        )
        if plan.tp > 1:
            notes.append(
                "- accelerate TP applies a Hugging Face transformers model's tp_plan: it needs "
                "transformers installed and a model class that defines one."
            )
    if "torchtitan.toml" in written and plan.tp > 1 and not plan.sequence_parallel:
        notes.append(
            "- torchtitan always uses sequence parallelism with TP: activations shrink, the "
            "communication volume stays the same."
        )
    if "torchtitan.toml" in written:
        notes.append(
            "- Not priced, so left at the framework's default: fused/chunked cross-entropy (the "
            "estimate prices an fp32 loss over the full logits)."
        )
    if "megatron_args.txt" in written:
        notes.append(
            f"- Megatron-LM: bash launch_torchrun.sh {megatron_entry(model)} $(cat megatron_args.txt) plus "
            f"your data, tokenizer (vocabulary {model.vocab_size}), RoPE settings (base, scaling, partial "
            "rotary: config.json's, not priced), optimizer and schedule flags."
        )
        if plan.loss_kernel is LossKernel.FUSED:
            notes.append(
                "- The loss is Transformer Engine's cross-entropy (--cross-entropy-fusion-impl te), priced "
                "as TE 2.5-2.17 run it (bf16 logits, gradient in place); TE 2.18 keeps an fp32 gradient "
                "and Megatron-LM core_v0.19 refuses it (stability): there price with --loss-kernel fp32 "
                "(and drop both cross-entropy flags for core_v0.19)."
            )
        if model.mtp_layers:
            notes.append(
                f"- Multi-token prediction: --mtp-num-layers {model.mtp_layers} is priced (a block, eh_proj "
                "and a head pass per module on the last pipeline stage); its loss weight, "
                "--mtp-loss-scaling-factor, is yours (Megatron's default 0.1)."
            )
        if plan.moe_a2a_overlap:
            notes.append(
                "- Megatron's EP overlap runs two streams at once: autotune_env.sh sets "
                "CUDA_DEVICE_MAX_CONNECTIONS=32 (moe/README.md); with TP/CP > 1 before Blackwell "
                "validate_args then warns that TP/CP collectives lose their queue order (not priced)."
            )
        elif plan.tp > 1 or plan.cp > 1:
            where = (
                "autotune_env.sh sets it"
                if plan.framework is Framework.MEGATRON
                else "set it yourself: autotune_env.sh does only for plans priced for Megatron"
            )
            notes.append(
                "- Megatron-LM with TP/CP > 1 needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell "
                f"(validate_args asserts it); {where}."
            )
    if "torchtitan.toml" in written and torchtitan_flavor(model) is None:
        family = torchtitan_model(model)
        notes.append(
            f"- torchtitan: no {family} flavor has this model's shape; register one named "
            f"'{model.name}' (torchtitan/models/{family}/__init__.py {REGISTRIES[family]}) or set [model] "
            "flavor."
        )
    return notes


def _launch_lines(written: set[str]) -> list[str]:
    """The one contract every launcher hands the user's script, then one line per launcher."""
    lines = [
        "## Launch",
        "",
        "Every launcher takes your training script and its flags and sources `autotune_env.sh`, which "
        "exports the plan and its configs for it (autotune.contract reads them; "
        "examples/train_script/train.py shows a script that does):",
        "",
        *(
            f"- `{ENV[key]}`: {what}"
            for key, what in _CONTRACT.items()
            if key not in SCRIPT_CONFIG_KEYS or SCRIPT_CONFIGS[key] in written
        ),
        "",
        "Copy this folder anywhere: nothing in it names the machine that planned. `RUN_DIR` (default: "
        "the launcher's own folder) is where the plan and configs are read; `MASTER_ADDR` / "
        "`MASTER_PORT` override the rendezvous.",
        "",
    ]
    for name, how in _LAUNCHERS.items():
        if name in written:
            lines.append(f"- `{name}`: {how}")
    return lines


def _skipped_lines(skipped: list[tuple[str, list[str]]]) -> list[str]:
    grouped: dict[tuple[str, ...], list[str]] = {}
    for name, reasons in skipped:  # ds_config.json and launch_deepspeed.sh share their reasons
        grouped.setdefault(tuple(reasons), []).append(f"`{name}`")
    return [
        "",
        "## Not emitted",
        "",
        "These frameworks cannot run this plan as it was priced:",
        "",
        *(f"- {', '.join(names)}: {'; '.join(reasons)}." for reasons, names in grouped.items()),
    ]


def _measured_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The search's best measured trials, each measurement beside the cost model's prediction."""
    from autotune.render import plan_summary

    def gib(x: float | None) -> str:
        return f"{x / _GIB:.2f} GiB" if x else "-"

    lines = [
        "## Measured (real trials)",
        "",
        "Best measured first; the plan above is the first row. Predicted: the cost model for the "
        "catalog GPU.",
        "",
        "| # | trial | plan | measured tokens/s | predicted tokens/s | measured / predicted "
        "| measured peak memory | predicted memory | status |",
        "|" + "---|" * 9,
    ]
    for i, row in enumerate(rows, start=1):
        meas, pred = row.get("measured_tokens_per_s"), row.get("predicted_tokens_per_s")
        ratio = f"{meas / pred:.2f}" if meas and pred else "-"
        plan = plan_summary(ParallelPlan.from_dict(row["plan"]))
        lines.append(
            f"| {i} | {row.get('trial')} | {plan} | {meas or 0:,.0f} | {pred or 0:,.0f} | {ratio} "
            f"| {gib(row.get('measured_memory_bytes'))} | {gib(row.get('predicted_memory_bytes'))} "
            f"| {row.get('status')} |"
        )
    return lines


def render_summary(
    *,
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    estimate: dict[str, Any] | None,
    written: list[tuple[str, str]],
    skipped: list[tuple[str, list[str]]],
    measured: list[dict[str, Any]] | None = None,
) -> str:
    """``written``: (file, what it is); ``skipped``: (file, why its framework cannot express the plan);
    ``measured``: the search's best trials (``autotune search`` rows), or None when nothing was measured."""
    from autotune.render import params_line

    gpus = f"{cluster.num_nodes} node(s) x {cluster.gpus_per_node} {cluster.gpu.key}"
    lines = [
        f"# autotune plan: {model.name} on {cluster.name}",
        "",
        f"{cluster.num_gpus} GPUs ({gpus}), {params_line(model)}.",
        "",
        *_plan_table(plan),
        "",
        "## Estimate (cost model)",
        "",
        *_estimate_lines(estimate),
        "",
        *([*_measured_lines(measured), ""] if measured else []),
        "## Files",
        "",
        _priced_for(plan, model, {name for name, _ in written}),
        "",
        *(f"- `{name}`: {what}" for name, what in written),
    ]
    lines += ["", *_launch_lines({name for name, _ in written})]
    if skipped:
        lines += _skipped_lines(skipped)
    lines += ["", "## Notes", "", *_notes(plan, model, {name for name, _ in written})]
    return "\n".join(lines) + "\n"
