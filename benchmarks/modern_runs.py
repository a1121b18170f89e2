"""Predict published H100/H200/B200 training runs with the step-time model: tokens/s per GPU, predicted vs
measured, over ``benchmarks/data/modern_runs.yaml`` (branch ``data``) and ``modern_runs_speed.yaml``.

Each row becomes (ModelSpec, ClusterSpec, ParallelPlan) from its own fields only; what a source leaves out is
filled by the row's ``assumed`` text (the framework's published recipe), never by a fitted factor. Rows with a
``reason`` are predicted and shown; the reason names the published cause when one is beyond 30 %. MoE rows are
listed (moe_runs.py prices them). Statistics: median |error|, rows beyond 30 %, Kendall tau inside each group
of rows sharing model and cluster. Usage:  python benchmarks/modern_runs.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.catalog import load_gpu, load_model, make_cluster, model_from_dict
from autotune.costmodel import flops
from autotune.costmodel.steptime import step_time
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.report import kendall_tau
from autotune.specs import ClusterSpec, GPUSpec, ModelSpec
from autotune.usergpu import gpu_from_mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository root
from benchmarks import release_spread  # noqa: E402
from benchmarks._fsdp_stacks import FSDP_STACKS, row_numerics  # noqa: E402

ROOT = Path(__file__).resolve().parent
DATA = [ROOT / "data" / "modern_runs.yaml", ROOT / "data" / "modern_runs_speed.yaml"]
OUTLIER = 0.30
BASELINE = ROOT / "results" / "modern_runs_baseline_704b6b1.json"
"""Errors of the same rows under the model before issue 22 (commit 704b6b1: one GEMM efficiency for every GPU
and dtype, no fp8 casts, no attention kernels, no speed knobs; torchtitan op-SAC as Megatron's selective),
computed once by running that commit's ``step_time`` on each row's plan."""


@dataclass
class Outcome:
    id: str
    group: str
    setup: str
    measured: float
    predicted: float
    reason: str = ""
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


_GPU_NOTE = re.compile(r"(?P<mem>\d+) GB HBM2e \((?P<bw>[\d.]+) TB/s\), default (?P<w>\d+) W")
FP8_RECIPES = {"current": "tensorwise", "mxfp8": "mx", None: "delayed"}
"""Data-file recipe names -> plan recipes; an fp8 row without a recipe ran Transformer Engine's default of its
time, delayed scaling."""
_ACTS = {"relu2": "relu"}
"""Squared ReLU (Nemotron) has the shape of a two-matrix ReLU MLP."""
_PROVENANCE = re.compile(r"_source$")
"""Keys of a row's ``shape`` that say where the shape was read (``shape_source``): data-file metadata, kept
out of the model config so the model reader's refusal of unknown keys stays strict for users."""


def row_model(row: dict[str, Any]) -> ModelSpec:
    shape = row.get("shape") or row.get("model_config")
    if shape:
        cfg = {k: v for k, v in shape.items() if not _PROVENANCE.search(k)}
        cfg["hidden_act"] = _ACTS.get(cfg.get("hidden_act"), cfg.get("hidden_act"))
        return model_from_dict({k: v for k, v in cfg.items() if v is not None}, name=row["id"])
    return load_model(str(row["model"]))


def _gpu(row: dict[str, Any]) -> GPUSpec:
    """The catalog GPU, or the card its ``gpu_note`` describes (Meta's Grand Teton H100s: 96 GB HBM2e at
    2.4 TB/s, 500 W) as a described GPU (``autotune.usergpu``)."""
    gpu = row["gpu"]
    if isinstance(gpu, dict):
        return gpu_from_mapping(gpu, where=row["id"])
    note = _GPU_NOTE.search(str(row.get("gpu_note") or ""))
    if note:
        return gpu_from_mapping(
            {
                "base": gpu,
                "memory_gib": int(note["mem"]),
                "memory_bandwidth_gb_s": float(note["bw"]) * 1000,
                "power_limit_w": int(note["w"]),
            },
            where=row["id"],
        )
    return load_gpu(gpu)


def row_cluster(row: dict[str, Any]) -> ClusterSpec:
    """The row's cluster: its GPU (``_gpu``: a catalog card or the one its note describes) and node size."""
    n = int(row["num_gpus"])
    return make_cluster(num_gpus=n, gpu=_gpu(row), gpus_per_node=min(n, int(row.get("gpus_per_node") or 8)))


def _attention_kernel(row: dict[str, Any]) -> str:
    """The attention kernel the row's software ran (an assumption per software, not per row): Transformer
    Engine before 1.8 (NeMo 24.03) preferred flash-attn 2 on Hopper, later TE cuDNN fused attention; torch
    SDPA (torchtitan, torch 2.5.1-2.8) runs FlashAttention-2 on Hopper, llm-foundry's MPT flash-attn 2."""
    text = f"{row.get('source', '')} {row.get('notes', '')}"
    if row.get("attention_kernel"):
        return str(row["attention_kernel"])
    if row["framework"] in (*FSDP_STACKS, "fsdp") or "24.03" in text:
        return "fa2"
    return "cudnn"


_RECOMPUTE = {"op-sac": "selective", "None": "none"}
"""torchtitan per-op SAC is framework fsdp's selective recompute (``compute.op_sac_recompute_s``); unstated
recompute (NeMo performance recipes) is none."""
_KNOB_FIELDS = ("compile", "async_tp", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")
_SHARDING = {"megatron-fsdp": "zero1"}
"""Megatron-FSDP shards parameters too; its gathers overlap like the distributed optimizer's, so for speed it
is the ZeRO-1 plan (memory: issue 21)."""


def _plan(row: dict[str, Any], model: ModelSpec) -> ParallelPlan:
    tp, pp, cp = int(row.get("tp") or 1), int(row.get("pp") or 1), int(row.get("cp") or 1)
    dp = int(row["num_gpus"]) // (tp * pp * cp)
    vp = int(row.get("vp") or 1)
    fw = str(row.get("framework", "megatron"))
    fw = "fsdp" if fw in FSDP_STACKS else fw
    sharding = _SHARDING.get(row.get("sharding"), row.get("sharding")) or (
        "zero1" if fw == "megatron" and dp > 1 else "none"
    )
    if sharding == "zero1" and dp == 1:
        sharding = "none"
    if row.get("framework") == "torchtitan" and pp > 1 and sharding == "fsdp-full":
        # torchtitan keeps pipelined blocks gathered after forward (reshard_after_forward=False "to avoid
        # per-microbatch all-gathers": torchtitan/parallelisms/parallelize_llama.py apply_fsdp at 9dec370)
        sharding = "fsdp-grad-op"
    knobs = {k: v for k, v in (row.get("knobs") or {}).items() if v is not None}
    extra: dict[str, Any] = {k: bool(knobs[k]) for k in _KNOB_FIELDS if k in knobs}
    dropped = (
        ("compile", "async_tp")
        if fw == "megatron"
        else ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")
    )
    for k in dropped + (("tp_comm_overlap", "async_tp") if tp == 1 else ()):
        extra.pop(k, None)
    if extra.get("async_tp"):
        extra["compile"] = True
    if fw == "fsdp" and cp > 1:  # torchtitan's default context_parallel_rotate_method (config/job_config.py)
        extra["cp_comm"] = "allgather"
    if fw == "fsdp":  # llm-foundry's fused loss, AutoModel's bf16 model and loss (the row's numerics)
        extra.update(row_numerics(row))
    if fw == "megatron" and row.get("cross_entropy") == "te":  # Transformer Engine's loss (data README)
        extra["loss_kernel"] = "fused"
    if row.get("grad_reduce_dtype") and fw == "megatron":  # the recipe's gradient dtype (data note)
        extra["grad_reduce_dtype"] = row["grad_reduce_dtype"]
    if fw == "megatron" and (n := offload_layers(row)):  # Megatron --cpu-offloading-num-layers (activations)
        extra["offload_activation_layers"] = n
    # Megatron --recompute-method block --recompute-num-layers N, as benchmarks/memory_published.py reads it
    layers = re.search(r"recompute_num_layers=(\d+)", str(row.get("recompute_detail")))
    if layers and fw == "megatron":
        extra["recompute_layers"] = int(layers.group(1))
    precision = row.get("precision", "bf16")
    if precision == "fp8":
        extra["fp8_recipe"] = FP8_RECIPES.get(row.get("fp8_recipe"), row.get("fp8_recipe"))
    mbs = int(row.get("micro_batch") or row.get("mbs") or 1)
    if fw == "fsdp" and pp > 1 and not row.get("micro_batch"):
        # torchtitan's pipeline_parallel_microbatches defaults to the number of stages (the data's note)
        mbs = max(1, int(row.get("global_batch") or row["gbs"]) // (dp * pp))
        if "interleaved" in str(row["id"]):
            vp = 2  # an assumption: two stages per rank
    vp_schedule = "interleaved" if vp > 1 else "1f1b"
    return ParallelPlan(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        micro_batch=mbs,
        global_batch=int(row.get("global_batch") or row["gbs"]),
        seq_len=int(row.get("seq_len") or row["seq"]),
        sharding=sharding,
        recompute=_RECOMPUTE.get(str(row.get("recompute")), row.get("recompute")),
        sequence_parallel=tp > 1,
        schedule=vp_schedule,
        virtual_stages=vp,
        precision=precision,
        framework=fw,
        **extra,
    )


def offload_layers(row: dict[str, Any]) -> int:
    """Megatron-Bridge's ``cpu_offloading_num_layers`` of a row's recipe (its notes or recompute detail): the
    layers whose activations go to the host (``plan.offload_activation_layers``); 0 when it sets none."""
    found = re.search(
        r"cpu_offloading_num_layers'*[:=]\s*(\d+)", f"{row.get('notes')} {row.get('recompute_detail')}"
    )
    return int(found.group(1)) if found else 0


def _measured(row: dict[str, Any], model: ModelSpec) -> float:
    if isinstance(row.get("measured"), dict):
        return float(row["measured"]["tokens_per_s_per_gpu"])
    if "measured_tokens_per_s_per_gpu" in row:
        return float(row["measured_tokens_per_s_per_gpu"])
    # model TFLOP/s in NeMo's convention (full attention, no recompute): our model_flops_per_token
    per_token = flops.model_flops_per_token(model, int(row["seq"]))
    return float(row["measured_model_tflops_per_gpu"]) * 1e12 / per_token


def _published_caveat(row: dict[str, Any], plan: ParallelPlan) -> str:
    """A cause the source itself states for a row the model cannot price: an unstated power limit, or
    torchtitan's own note on its vanilla-TP float8 rowwise baseline."""
    note = str(row.get("gpu_note") or "")
    if ("power limit" in note and "not stated" in note) or "'power limited'" in note:
        return f"the source's cards run at an unstated power limit ({note})"
    if plan.fp8_recipe.value == "rowwise" and plan.tp > 1 and str(plan.precision) == "fp8":
        return (
            "torchtitan#1207: vanilla-TP float8 rowwise runs below its bf16 baseline (the benchmark's "
            "own note)"
        )
    return ""


def predict_row(row: dict[str, Any]) -> Outcome:
    model, cluster = row_model(row), row_cluster(row)
    plan = _plan(row, model)
    kernel = _attention_kernel(row)
    t = step_time(model, cluster, plan, attention_kernel=kernel)
    step_s = t.step_time_s
    predicted = plan.tokens_per_step / step_s / plan.world_size
    vp = f"v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    recipe = f"/{row.get('fp8_recipe', '')}" if plan.precision == "fp8" else ""
    knobs = ",".join(k for k, v in (row.get("knobs") or {}).items() if v)
    setup = (
        f"{cluster.gpu.name} x{plan.world_size} TP{plan.tp} PP{plan.pp}{vp} CP{plan.cp} DP{plan.dp} "
        f"mbs{plan.micro_batch} seq{plan.seq_len} {plan.precision}{recipe} "
        f"ac:{row.get('recompute', 'none')} {plan.framework} {knobs} attn:{kernel}"
    )
    table = re.split(r"[,(]", str(row.get("source", "")))[0].strip()
    group = f"{row.get('model') or row['id']} | {cluster.gpu.name} x{plan.world_size} | {table}"
    parts = {k: round(v, 4) for k, v in t.as_dict().items() if v and k.endswith("_s")}
    reason = str(row.get("reason", "")) or _published_caveat(row, plan)
    return Outcome(row["id"], group, setup, _measured(row, model), predicted, reason, parts)


def load_rows() -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Rows to predict and ``(id, why not)`` for the rest: ``modern_runs.yaml`` (branch ``data``) when
    present, else the seed set ``modern_runs_speed.yaml``."""
    data, seed = DATA
    if data.exists():
        rows = yaml.safe_load(data.read_text())
    else:
        rows = yaml.safe_load(seed.read_text())["runs"]
    use, skip = [], []
    for row in rows:
        why = _skip_reason(row)
        (skip.append((str(row["id"]), why)) if why else use.append(row))
    return use, skip


def _skip_reason(row: dict[str, Any]) -> str:
    from autotune.catalog import gpu_names

    if row.get("moe"):
        return "MoE (priced by issue 23)"
    if not isinstance(row["gpu"], dict) and row["gpu"] not in gpu_names():
        return f"GPU {row['gpu']} not in the catalog"
    if row.get("framework") not in ("megatron", *FSDP_STACKS, "fsdp", None):
        return f"framework {row.get('framework')} not modelled"
    measured = row.get("measured")
    if isinstance(measured, dict) and not measured.get("tokens_per_s_per_gpu"):
        return "no tokens/s published"
    return str(row.get("speed_unpriced") or "")


def _tau_or_nan(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b (``autotune.report.kendall_tau``: a group repeating one layout in two releases has a
    tie in its predictions that tau-a would count against the model); NaN where undefined."""
    tau = kendall_tau(xs, ys)
    return float("nan") if tau is None else tau


def name_other_releases(rows: list[dict[str, Any]], outcomes: list[Outcome]) -> list[release_spread.Group]:
    """The same-layout groups of ``rows`` (``release_spread``), and as the reason of each outcome beyond
    ``OUTLIER`` without one: a release that ran its layout near the prediction. Rows with a published caveat
    say nothing of releases and are left out of the groups."""
    plain = [o for o in outcomes if not o.reason]
    predicted, measured = {o.id: o.predicted for o in plain}, {o.id: o.measured for o in plain}
    spread = release_spread.groups(rows, predicted, measured)
    for o in outcomes:
        if abs(o.error) > OUTLIER and not o.reason:
            o.reason = release_spread.other_release_reason(o.id, spread)
    return spread


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    errs = [abs(o.error) for o in outcomes]
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.group, []).append(o)
    taus = {  # a group of one layout (two submitters of one MLPerf config) has nothing to rank
        g: _tau_or_nan([o.predicted for o in os], [o.measured for o in os])
        for g, os in groups.items()
        if len({o.predicted for o in os}) >= 2
    }
    # rows that differ in their setup but get one prediction: the model does not rank them (tau undefined)
    tied = [g for g, os in groups.items() if len({o.predicted for o in os}) == 1 < len({o.setup for o in os})]
    return {
        "kendall_tau_undefined": tied,
        "rows": len(outcomes),
        "median_abs_error": statistics.median(errs) if errs else float("nan"),
        "beyond_30pct": [o.id for o in outcomes if abs(o.error) > OUTLIER],
        "beyond_30pct_unexplained": [o.id for o in outcomes if abs(o.error) > OUTLIER and not o.reason],
        "kendall_tau": taus,
    }


def _markdown(
    outcomes: list[Outcome],
    skipped: list[tuple[str, str]],
    stats: dict[str, Any],
    spread: list[release_spread.Group],
) -> str:
    lines = [
        "# Step-time model vs published H100/H200/B200 runs",
        "",
        "Generated by `python benchmarks/modern_runs.py` from benchmarks/data/modern_runs*.yaml "
        "(sources per row there). Error = predicted tokens/s per GPU / measured - 1.",
        "",
        f"**Rows: {stats['rows']}; median |error| {100 * stats['median_abs_error']:.1f}%; beyond 30%: "
        f"{len(stats['beyond_30pct'])} ({len(stats['beyond_30pct_unexplained'])} without a named "
        "reason).**",
        "",
        "Kendall tau-b within groups sharing model and cluster (and at least two layouts):",
        "",
    ]
    lines += [f"- {g}: {tau:+.2f}" for g, tau in sorted(stats["kendall_tau"].items())]
    lines += [
        f"- {g}: undefined, one prediction for rows whose setups differ"
        for g in stats["kendall_tau_undefined"]
    ]
    before = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    if before:
        errs = [abs(v) for k, v in before.items() if k in {o.id for o in outcomes}]
        lines += [
            "",
            f"Before issue 22 (commit 704b6b1, same rows): median |error| "
            f"{100 * statistics.median(errs):.1f}%, beyond 30%: {sum(e > OUTLIER for e in errs)} of "
            f"{len(errs)}.",
        ]
    lines += [
        "",
        "| row | setup | measured tok/s/GPU | predicted | error | before | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        was = f"{100 * before[o.id]:+.0f}%" if o.id in before else ""
        lines.append(
            f"| {o.id} | {o.setup} | {o.measured:,.0f} | {o.predicted:,.0f} | {100 * o.error:+.1f}% "
            f"| {was} | {o.reason} |"
        )
    lines += release_spread.markdown(spread)
    if skipped:
        lines += ["", f"Not predicted ({len(skipped)} rows):", ""]
        lines += [f"- {rid}: {why}" for rid, why in skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    rows, skipped = load_rows()
    outcomes = []
    for row in rows:
        try:
            outcomes.append(predict_row(row))
        except ConfigError as e:  # a layout the plan cannot express: listed, not hidden
            skipped.append((str(row["id"]), f"not expressible as a plan: {e}"))
    spread = name_other_releases(rows, outcomes)
    stats = summarize(outcomes)
    text = _markdown(outcomes, skipped, stats, spread)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "modern_runs.md").write_text(text)
    rows_out = [dataclasses.asdict(o) | {"error": o.error} for o in outcomes]
    payload = {"summary": stats, "rows": rows_out, "not_predicted": dict(skipped)}
    (args.out / "modern_runs.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
