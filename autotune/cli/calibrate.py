"""``autotune calibrate --study NAME``: fit the cost model's efficiency factors to a study's measured trials.

Examples::

    autotune calibrate --study tiny-2xcpu                 # runs/tiny-2xcpu/calibration.yaml + summary.json
    autotune calibrate --study s1 --holdout 0.3           # fit on 70 %, report the held-out 30 % too
    autotune estimate ... --profile runs/s1/calibration.yaml   # use the fit

The model and cluster are the study's (``study.json``: the model, ``NxK gpu``, and the ``--profile`` the
search used); pass ``--model``/``--gpus``/``--gpu``/``--profile`` to override.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from autotune.catalog import load_model, make_cluster
from autotune.errors import ConfigError
from autotune.probe.profile import with_profile
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["CalibrateCommand"]


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


class CalibrateCommand:
    help = "Fit the cost model's efficiency factors to a study's measured trials (tau, MAPE before/after)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--study", required=True, help="study name (a directory under --out)")
        p.add_argument("--out", default="runs", metavar="DIR", help="runs directory (default ./runs)")
        p.add_argument(
            "--holdout",
            type=_fraction,
            default=0.0,
            metavar="F",
            help="fit on 1-F of the trials and report the held-out F too (default 0)",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the hold-out split")
        p.add_argument("--model", help="override the study's model")
        p.add_argument("--gpus", type=int, help="override the study's GPU count")
        p.add_argument("--gpu", help="override the study's GPU type")
        p.add_argument("--gpus-per-node", type=int, help="override the study's GPUs per node")
        p.add_argument(
            "--profile", metavar="FILE", help="the profile the search used (default: study.json's)"
        )
        p.add_argument("--json", action="store_true", help="print the calibration block as JSON")

    def run(self, args: argparse.Namespace) -> int:
        import optuna

        from autotune.calibrate import MIN_TRIALS, calibrate_study

        study_dir = Path(args.out) / args.study
        marker = study_dir / "study.json"
        if not marker.is_file():
            raise ConfigError(f"no study '{args.study}' under {args.out}/ (no {marker})")
        info = json.loads(marker.read_text())
        model, cluster = _model_cluster(args, info)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=info["study"], storage=info["storage"])
        block = calibrate_study(study, model, cluster, study_dir, holdout=args.holdout, seed=args.seed)
        if block is None:
            raise ConfigError(f"study '{args.study}' has fewer than {MIN_TRIALS} measured trials to fit")
        summary = study_dir / "summary.json"
        if summary.is_file():  # the report reads the calibration from here
            data = json.loads(summary.read_text())
            summary.write_text(json.dumps(data | {"calibration": block}, indent=2) + "\n")
        print(json.dumps(block, indent=2) if args.json else format_calibration(block))
        return 0


def _model_cluster(args: argparse.Namespace, info: dict[str, Any]) -> tuple[ModelSpec, ClusterSpec]:
    match = re.fullmatch(r"(\d+)x(\d+) (\S+)", str(info.get("cluster", "")))
    if not match and not (args.gpus and args.gpu):
        raise ConfigError(
            f"cannot read the cluster {info.get('cluster')!r} of the study; pass --gpus and --gpu"
        )
    nodes, per_node, gpu = (int(match[1]), int(match[2]), match[3]) if match else (1, args.gpus, args.gpu)
    num = args.gpus or nodes * per_node
    cluster = make_cluster(
        num_gpus=num,
        gpu=args.gpu or gpu,
        gpus_per_node=args.gpus_per_node or (per_node if num % per_node == 0 else None),
    )
    profile = args.profile or info.get("profile")
    if profile:
        cluster = with_profile(cluster, profile)
    return load_model(args.model or info["model"]), cluster


def format_calibration(block: dict[str, Any]) -> str:
    """Every trial's predicted vs measured step time, then tau and MAPE before and after, and the factors."""
    lines = [f"{'trial':>6} {'measured':>10} {'before':>10} {'err':>7} {'after':>10} {'err':>7}"]
    for row in block["trials"]:
        m = row["measured_s"]
        b, a = row["predicted_before_s"], row["predicted_after_s"]
        tag = "  (held out)" if row.get("held_out") else ""
        lines.append(
            f"{row['trial']:>6} {m * 1e3:>8.1f}ms {b * 1e3:>8.1f}ms {b / m - 1:>+7.0%} "
            f"{a * 1e3:>8.1f}ms {a / m - 1:>+7.0%}{tag}"
        )

    def line(name: str, d: dict[str, Any]) -> str:
        tau = "n/a" if d["kendall_tau"] is None else f"{d['kendall_tau']:+.2f}"
        return f"{name:<16} Kendall tau {tau}, MAPE {d['mape']:.1%} ({d['num_trials']} trials)"

    lines += ["", line("before the fit", block["before"]), line("after the fit", block["after"])]
    if block.get("holdout"):
        lines += [
            line("held out before", block["holdout"]["before"]),
            line("held out after", block["holdout"]["after"]),
        ]
    f = block["factors"]
    lines.append(
        "factors          "
        + ", ".join(f"{k} {v * 1e3:.2f} ms" if k.endswith("_s") else f"{k} {v:.3g}" for k, v in f.items())
    )
    lines.append(
        f"fitted           {', '.join(block['fitted'])}"
        + (
            f"; not identified by these trials: {', '.join(block['unidentified'])}"
            if block["unidentified"]
            else ""
        )
    )
    if block.get("path"):
        lines.append(f"wrote            {block['path']} (use it with --profile)")
    return "\n".join(lines)
