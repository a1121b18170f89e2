"""``autotune explain``: where a plan's step time and memory go, what binds, and which one change helps most.

Examples::

    autotune explain --plan runs/70b-16xh100-sxm/best/plan.json     # the plan a search chose
    autotune explain --model 70b --gpus 16 --tp 8 --sharding fsdp-full --global-batch 512 --seq-len 4096
    autotune explain --plan plan.json --json

With ``--plan`` the model and cluster come from the file (``--model``, ``--gpus``/``--cluster`` override them,
and are needed for a bare plan mapping); the plan flags are for the form without a file, as in ``estimate``.
"""

from __future__ import annotations

import argparse
import json

from autotune.catalog import load_model
from autotune.cli._args import (
    add_model_cluster_args,
    add_plan_args,
    cluster_from_flags,
    plan_from_args,
    resolve_model_cluster,
)
from autotune.clusterfile import load_cluster
from autotune.errors import ConfigError
from autotune.explain import Explanation, explain
from autotune.plan import ParallelPlan
from autotune.render import format_estimate, gib, params_line, plan_summary
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["ExplainCommand"]


class ExplainCommand:
    help = "Explain a plan: where time and memory go, what binds, and the single-knob changes that help most."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--plan", metavar="FILE", help="plan.json (from search/emit: runs/<study>/best/plan.json)"
        )
        add_model_cluster_args(p)
        for action in p._actions:  # --model comes from the plan file when one is given
            if action.dest == "model":
                action.required = False
        add_plan_args(p)
        p.add_argument("--suggestions", type=int, default=3, metavar="K", help="changes to show (default 3)")
        p.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        model, cluster, plan = _inputs(args)
        result = explain(model, cluster, plan, limit=max(args.suggestions, 0))
        if args.json:
            print(
                json.dumps(
                    {
                        **result.to_dict(),
                        "model": model.name,
                        "cluster": cluster.name,
                        "num_gpus": cluster.num_gpus,
                    },
                    indent=2,
                )
            )
        else:
            print(_text(result, model, cluster))
        return 0


def _inputs(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec, ParallelPlan]:
    if not args.plan:
        if not args.model:
            raise ConfigError("pass --plan FILE, or --model and the plan flags as for `autotune estimate`")
        model, cluster = resolve_model_cluster(args)
        return model, cluster, plan_from_args(args, model, cluster)
    from autotune.emit import read_plan_document

    doc = read_plan_document(args.plan)
    stored = load_model(args.model) if args.model else doc.model
    if stored is None:
        raise ConfigError(f"{args.plan} names no model; pass --model (a preset or a config.json path)")
    if args.cluster:
        return stored, load_cluster(args.cluster), doc.plan
    if args.gpus is not None:
        return (
            stored,
            cluster_from_flags(args, args.gpus),
            doc.plan,
        )
    if doc.cluster is None:
        raise ConfigError(f"{args.plan} names no cluster; pass --gpus N [--gpu T] or --cluster FILE")
    return stored, doc.cluster, doc.plan


def _text(result: Explanation, model: ModelSpec, cluster: ClusterSpec) -> str:
    est = result.estimate
    lines = [
        f"model     {model.name} ({params_line(model)})",
        f"cluster   {cluster.name} ({cluster.intra_link.key} inside nodes, "
        f"{cluster.nics_per_node}x {cluster.inter_link.key} per node)",
        format_estimate(est),
        "",
        f"binds     {result.binds}",
        "",
    ]
    if not result.suggestions:
        lines.append(
            f"no single-knob change helps ({result.num_neighbours} legal neighbours tried): "
            "this plan is a local optimum of the cost model"
        )
        return "\n".join(lines)
    what = "tokens/s gain" if est.feasible else "memory freed"
    lines.append(f"what would help most ({what}; {result.num_neighbours} legal single-knob changes tried):")
    for i, s in enumerate(result.suggestions, start=1):
        e = s.estimate
        effect = (
            f"{s.tokens_per_s_gain:+.1%} tokens/s ({e.tokens_per_s:,.0f})"
            if est.feasible
            else f"frees {gib(s.memory_freed_bytes)} -> {gib(e.memory_bytes_per_gpu)}"
            + ("" if e.feasible else " (still does not fit)")
            + (f", {e.tokens_per_s:,.0f} tokens/s" if e.feasible else "")
        )
        lines.append(f"  {i}. {s.change}: {effect}; then binds: {e.bottleneck}")
        lines.append(f"     {plan_summary(e.plan)}")
    return "\n".join(lines)
