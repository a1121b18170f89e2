"""Predict published H100/H200/B200 training runs with the step-time model: tokens/s per GPU, predicted vs
measured, over ``benchmarks/data/modern_runs.yaml`` (branch ``data``) and ``modern_runs_speed.yaml``.

Each row becomes (ModelSpec, ClusterSpec, ParallelPlan) from its own fields only; what a source leaves out is
filled by the row's ``assumed`` text (the framework's published recipe), never by a fitted factor. Rows with a
``reason`` are predicted and shown; the reason names the published cause when one is beyond 30 %. MoE rows are
listed as not predicted (issue 23). Statistics: median |error|, rows beyond 30 %, and Kendall tau between
predicted and measured inside each group of rows sharing model and cluster.

Usage:  python benchmarks/modern_runs.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.catalog import load_gpu, load_model, make_cluster, model_from_dict
from autotune.costmodel import flops
from autotune.costmodel.steptime import block_times, step_time
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec, ModelSpec
from autotune.usergpu import gpu_from_mapping

ROOT = Path(__file__).resolve().parent
DATA = [ROOT / "data" / "modern_runs.yaml", ROOT / "data" / "modern_runs_speed.yaml"]
OUTLIER = 0.30


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


def _model(row: dict[str, Any]) -> ModelSpec:
    if "model_config" in row:
        return model_from_dict(dict(row["model_config"]), name=row["id"])
    return load_model(str(row["model"]))


def _cluster(row: dict[str, Any]) -> ClusterSpec:
    n = int(row["num_gpus"])
    gpu = row["gpu"]
    spec = gpu_from_mapping(gpu, where=row["id"]) if isinstance(gpu, dict) else load_gpu(gpu)
    return make_cluster(num_gpus=n, gpu=spec, gpus_per_node=min(n, int(row.get("gpus_per_node", 8))))


_RECOMPUTE = {"op-sac": "none"}  # torchtitan per-op SAC: priced on top of none (``_op_sac_extra_s``)
_KNOB_FIELDS = ("compile", "async_tp", "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")


def _plan(row: dict[str, Any], model: ModelSpec) -> ParallelPlan:
    tp, pp, cp = int(row.get("tp", 1)), int(row.get("pp", 1)), int(row.get("cp", 1))
    dp = int(row["num_gpus"]) // (tp * pp * cp)
    vp = int(row.get("vp") or 1)
    fw = row.get("framework", "megatron")
    sharding = row.get("sharding") or ("zero1" if fw == "megatron" and dp > 1 else "none")
    fields = {f.name for f in dataclasses.fields(ParallelPlan)}
    extra: dict[str, Any] = {}
    knobs = dict(row.get("knobs") or {})
    for k in _KNOB_FIELDS:
        if k in fields and k in knobs:
            extra[k] = bool(knobs[k])
    if tp == 1:  # the recipes' TP-comm overlap has nothing to overlap without TP
        extra.pop("tp_comm_overlap", None)
    if "fp8_recipe" in fields and row.get("precision") == "fp8":
        extra["fp8_recipe"] = row.get("fp8_recipe", "tensorwise")
    return ParallelPlan(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=int(row.get("mbs", 1)),
                        global_batch=int(row["gbs"]), seq_len=int(row["seq"]), sharding=sharding,
                        recompute=_RECOMPUTE.get(str(row.get("recompute", "none")), row.get("recompute")),
                        sequence_parallel=tp > 1,
                        schedule="interleaved" if vp > 1 else "1f1b", virtual_stages=vp,
                        precision=row.get("precision", "bf16"), framework=fw, **extra)


def _measured(row: dict[str, Any], model: ModelSpec) -> float:
    if "measured_tokens_per_s_per_gpu" in row:
        return float(row["measured_tokens_per_s_per_gpu"])
    # model TFLOP/s in NeMo's convention (full attention, no recompute): our model_flops_per_token
    per_token = flops.model_flops_per_token(model, int(row["seq"]))
    return float(row["measured_model_tflops_per_gpu"]) * 1e12 / per_token


def _op_sac_extra_s(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan, kernel: str | None) -> float:
    """torchtitan's per-op selective AC: it saves matmul outputs "except every second mm" and SDPA's, so a
    Llama block recomputes wk, wo, w3 and every elementwise op (torchtitan parallelize_llama.py; the same
    pricing as benchmarks/published_runs.py ``_torchtitan_sac_s``)."""
    h, kv, f = model.hidden_size, model.kv_hidden_size, model.ffn_hidden_size
    share = (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)
    bt = block_times(model, cluster, plan, attention_kernel=kernel)
    return plan.num_microbatches * model.num_layers * (share * bt.gemm_s + bt.ew_s)


def predict_row(row: dict[str, Any]) -> Outcome:
    model, cluster = _model(row), _cluster(row)
    plan = _plan(row, model)
    kernel = row.get("attention_kernel")
    t = step_time(model, cluster, plan, attention_kernel=kernel)
    step_s = t.step_time_s
    if row.get("recompute") == "op-sac":
        step_s += _op_sac_extra_s(model, cluster, plan, kernel)
    predicted = plan.tokens_per_step / step_s / plan.world_size
    gpu = cluster.gpu.key
    vp = f"v{plan.virtual_stages}" if plan.virtual_stages > 1 else ""
    recipe = f"/{row.get('fp8_recipe', '')}" if plan.precision == "fp8" else ""
    knobs = ",".join(k for k, v in (row.get("knobs") or {}).items() if v)
    setup = (f"{cluster.gpu.name} x{plan.world_size} TP{plan.tp} PP{plan.pp}{vp} CP{plan.cp} DP{plan.dp} "
             f"mbs{plan.micro_batch} seq{plan.seq_len} {plan.precision}{recipe} "
             f"ac:{row.get('recompute', 'none')} {plan.framework} {knobs} {row.get('attention_kernel', '')}")
    group = f"{row.get('model') or row['id']}|{gpu}|x{plan.world_size}|{plan.framework}"
    parts = {k: round(v, 4) for k, v in t.as_dict().items() if v and k.endswith("_s")}
    reason = str(row.get("reason", ""))
    return Outcome(row["id"], group, setup, _measured(row, model), predicted, reason, parts)


def load_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: dict[str, dict[str, Any]] = {}
    moe: list[dict[str, Any]] = []
    for path in DATA:
        if not path.exists():
            continue
        data = yaml.safe_load(path.read_text())
        for row in data.get("runs", []):
            if row.get("moe") or row.get("num_experts"):
                moe.append(row)
            else:
                rows.setdefault(str(row["id"]), row)
        moe += data.get("moe_runs", [])
    return list(rows.values()), moe


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-a over all pairs (ties count 0)."""
    pairs = list(itertools.combinations(range(len(xs)), 2))
    if not pairs:
        return float("nan")
    s = sum((1 if (xs[i] - xs[j]) * (ys[i] - ys[j]) > 0 else -1 if (xs[i] - xs[j]) * (ys[i] - ys[j]) < 0
             else 0) for i, j in pairs)
    return s / len(pairs)


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    errs = [abs(o.error) for o in outcomes]
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.group, []).append(o)
    taus = {g: kendall_tau([o.predicted for o in os], [o.measured for o in os])
            for g, os in groups.items() if len(os) >= 2}
    return {"rows": len(outcomes), "median_abs_error": statistics.median(errs) if errs else float("nan"),
            "beyond_30pct": [o.id for o in outcomes if abs(o.error) > OUTLIER],
            "beyond_30pct_unexplained": [o.id for o in outcomes if abs(o.error) > OUTLIER and not o.reason],
            "kendall_tau": taus}


def _markdown(outcomes: list[Outcome], moe: list[dict[str, Any]], stats: dict[str, Any]) -> str:
    lines = ["# Step-time model vs published H100/H200/B200 runs", "",
             "Generated by `python benchmarks/modern_runs.py` from benchmarks/data/modern_runs*.yaml "
             "(sources per row there). Error = predicted tokens/s per GPU / measured - 1.", "",
             f"**Rows: {stats['rows']}; median |error| {100 * stats['median_abs_error']:.1f}%; beyond 30%: "
             f"{len(stats['beyond_30pct'])} ({len(stats['beyond_30pct_unexplained'])} without a named "
             "reason).**",
             "", "Kendall tau within groups sharing model and cluster:", ""]
    lines += [f"- {g}: {tau:+.2f}" for g, tau in sorted(stats["kendall_tau"].items())]
    lines += ["", "| row | setup | measured tok/s/GPU | predicted | error | reason |",
              "|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| {o.id} | {o.setup} | {o.measured:,.0f} | {o.predicted:,.0f} | {100 * o.error:+.1f}% "
                     f"| {o.reason} |")
    if moe:
        lines += ["", "Not predicted (MoE; issue 23): " + ", ".join(str(r["id"]) for r in moe)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args(argv)
    rows, moe = load_rows()
    outcomes = [predict_row(r) for r in rows]
    stats = summarize(outcomes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "modern_runs.md").write_text(_markdown(outcomes, moe, stats))
    (args.out / "modern_runs.json").write_text(json.dumps(
        {"summary": stats, "rows": [dataclasses.asdict(o) | {"error": o.error} for o in outcomes],
         "not_predicted_moe": [r["id"] for r in moe]}, indent=1) + "\n")
    print(_markdown(outcomes, moe, stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
