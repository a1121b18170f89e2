"""``autotune emit``: write the launch files for a plan.

``plan.json`` as written by ``emit`` or ``search`` carries its model and cluster, so
``autotune emit --plan runs/x/best/plan.json --out d`` needs nothing else. ``--model`` and
``--gpus/--gpu``/``--cluster`` override what the file says (and are required for a bare plan mapping).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from autotune.catalog import load_model, make_cluster
from autotune.cli._args import _positive_int
from autotune.clusterfile import load_cluster
from autotune.emit import emit_all, read_plan_document
from autotune.errors import ConfigError
from autotune.specs import ClusterSpec, ModelSpec
from autotune.userfile import writable_dir

__all__ = ["EmitCommand"]


def _model(args: argparse.Namespace, stored: ModelSpec | None) -> ModelSpec:
    if args.model:
        return load_model(args.model)
    if stored is None:
        raise ConfigError(f"{args.plan} names no model; pass --model (a preset or a config.json path)")
    return stored


def _cluster(args: argparse.Namespace, stored: ClusterSpec | None) -> ClusterSpec:
    if args.cluster:
        if args.gpus is not None or args.gpus_per_node is not None:
            raise ConfigError("--cluster describes the GPUs already; drop --gpus/--gpus-per-node")
        return load_cluster(args.cluster)
    if args.gpus is not None:
        return make_cluster(num_gpus=args.gpus, gpu=args.gpu or "h100-sxm", gpus_per_node=args.gpus_per_node)
    if args.gpu is not None or args.gpus_per_node is not None:
        raise ConfigError("--gpu/--gpus-per-node need --gpus (the total GPU count)")
    if stored is None:
        raise ConfigError(f"{args.plan} names no cluster; pass --gpus N [--gpu T] or --cluster FILE")
    return stored


def _estimate(model: ModelSpec, cluster: ClusterSpec, plan: Any, stored: dict[str, Any] | None) -> Any:
    """A fresh estimate when the cost model can give one, else what the plan file recorded."""
    try:
        from autotune.costmodel import estimate

        return estimate(model, cluster, plan)
    except NotImplementedError:
        return stored


class EmitCommand:
    help = "Write a plan's launch files (DeepSpeed, accelerate, torchrun/torchtitan, Megatron, Slurm, K8s)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--plan",
            required=True,
            metavar="FILE",
            help="plan.json (from search/emit, or a bare plan mapping)",
        )
        p.add_argument("--out", required=True, metavar="DIR", help="output directory")
        p.add_argument("--force", action="store_true", help="overwrite autotune files already in --out")
        p.add_argument(
            "--image",
            help="container image of pytorchjob.yaml (default: autotune:latest); "
            "it must hold torch, autotune and your training script",
        )
        g = p.add_argument_group("model and cluster (default: what plan.json records)")
        g.add_argument(
            "--model",
            help="preset (7b, 70b, llama3-8b, ...: autotune models lists them) or a config.json/YAML path",
        )
        g.add_argument("--gpus", type=_positive_int, help="total GPUs (with --gpu and --gpus-per-node)")
        g.add_argument("--gpu", help="GPU type from the catalog (default: h100-sxm)")
        g.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU's usual)")
        g.add_argument("--cluster", metavar="FILE", help="cluster YAML (gpu, num_nodes, gpus_per_node, ...)")

    def run(self, args: argparse.Namespace) -> int:
        doc = read_plan_document(args.plan)
        model, cluster = _model(args, doc.model), _cluster(args, doc.cluster)
        overridden = bool(args.model or args.cluster or args.gpus)  # the recorded estimate no longer applies
        estimate = _estimate(model, cluster, doc.plan, None if overridden else doc.estimate)
        writable_dir(args.out, "--out")
        for path in emit_all(
            doc.plan, model, cluster, estimate, args.out, force=args.force, image=args.image
        ):
            print(path)
        _warn_infeasible(estimate)
        return 0


def _warn_infeasible(estimate: Any) -> None:
    """Launch files are written for any legal plan; one the cost model says cannot run is said so."""
    feasible = getattr(estimate, "feasible", None)
    reasons = getattr(estimate, "reasons", None)
    if isinstance(estimate, dict):
        feasible, reasons = estimate.get("feasible"), estimate.get("reasons")
    if feasible is False:
        print(
            f"autotune emit: warning: the cost model predicts this plan fails: {(reasons or ['?'])[0]}; "
            "its launch files are written all the same",
            file=sys.stderr,
        )
