"""``autotune estimate``: the cost model's memory and step time for one fully specified plan."""

from __future__ import annotations

import argparse
import json

from autotune.cli._args import add_model_cluster_args, add_plan_args, plan_from_args, resolve_model_cluster
from autotune.costmodel import estimate
from autotune.errors import ConfigError
from autotune.plan import check_plan
from autotune.render import format_estimate, model_info, params_line

__all__ = ["EstimateCommand"]


class EstimateCommand:
    help = "Predict memory per GPU and step time of one plan (no GPU needed)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_model_cluster_args(p)
        add_plan_args(p)
        p.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        model, cluster = resolve_model_cluster(args)
        plan = plan_from_args(args, model, cluster)
        illegal = check_plan(plan, model, cluster)
        if illegal:  # an impossible layout is bad input, not an infeasible plan
            raise ConfigError(illegal[0])
        est = estimate(model, cluster, plan)
        if args.json:
            out = est.to_dict()
            out.update(
                model=model_info(model),
                cluster=cluster.name,
                num_gpus=cluster.num_gpus,
                profile=cluster.profile,
            )
            print(json.dumps(out, indent=2))
        else:
            print(f"model     {model.name} ({params_line(model)})")
            print(
                f"cluster   {cluster.name} ({cluster.intra_link.key} inside nodes, "
                f"{cluster.nics_per_node}x {cluster.inter_link.key} per node)"
            )
            if cluster.profile:
                print(f"hardware  {cluster.profile}")
            print(format_estimate(est))
        return 0
