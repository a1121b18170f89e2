"""``autotune scale``: the best plan at each GPU count, scaling efficiency, time and cost to train, and why.

Examples::

    autotune scale --model 13b --gpu h100-sxm --gpus 1,2,4,8,16,32,64 --tokens 1T --price-per-gpu-hour 2.5
    autotune scale --model 7b --gpus 8,16,32 --inter-node 1gbe --nics-per-node 1 --plot scale_1gbe.png
    autotune scale --model 70b --gpus 8,16,32 --json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from autotune.catalog import load_gpu, load_link, load_model
from autotune.cli._args import (
    DEFAULT_GPU,
    _positive_int,
    cluster_from_flags,
    default_global_batch,
    default_seq_len,
)
from autotune.cli.report import _price
from autotune.errors import ConfigError
from autotune.preflight import check_writable
from autotune.probe.profile import with_profile
from autotune.render import gib, param_count, plan_summary
from autotune.scale import ScalePoint, ScaleResult, parse_tokens, scale
from autotune.space import load_space
from autotune.specs import ClusterSpec
from autotune.userfile import writable_dir

__all__ = ["ScaleCommand"]

_DEFAULT_COUNTS = "1,2,4,8,16,32,64"


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU counts such as 1,2,4,8, got {text!r}") from None
    if not counts or any(n <= 0 for n in counts):
        raise argparse.ArgumentTypeError(f"expected positive GPU counts such as 1,2,4,8, got {text!r}")
    return counts


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1], got {text!r}")
    return value


class ScaleCommand:
    help = (
        "Best plan per GPU count: throughput, scaling efficiency, time and cost to train, and why it drops."
    )

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", required=True, help="preset (7b, 70b, ...) or a config.json/YAML path")
        p.add_argument("--gpu", default="h100-sxm", help="GPU type from the catalog (default: h100-sxm)")
        p.add_argument(
            "--gpus",
            type=_counts,
            default=_counts(_DEFAULT_COUNTS),
            metavar="N,N,...",
            help=f"GPU counts (default {_DEFAULT_COUNTS})",
        )
        p.add_argument(
            "--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU's usual 8)"
        )
        p.add_argument("--intra-node", metavar="LINK", help="intra-node link: nvlink4, pcie4, ...")
        p.add_argument("--inter-node", metavar="LINK", help="inter-node NIC type: ib-200, 100gbe, 1gbe, ...")
        p.add_argument("--nics-per-node", type=_positive_int, help="NICs per node (default: the GPU's usual)")
        p.add_argument("--host-memory-gib", type=float, help="host RAM per node for offload (default 1024)")
        p.add_argument(
            "--profile",
            metavar="FILE",
            help="a profile from `autotune probe` (or a study's calibration), at every count",
        )
        p.add_argument(
            "--global-batch",
            type=_positive_int,
            help="sequences per step, the same at every count (default: ~4M tokens)",
        )
        p.add_argument(
            "--seq-len", type=_positive_int, help="tokens per sequence (default: min(model max, 8192))"
        )
        p.add_argument(
            "--space", metavar="FILE", help="search space YAML or a bundled name (default: default)"
        )
        p.add_argument("--tokens", type=parse_tokens, metavar="N", help="training tokens, e.g. 1T or 300B")
        p.add_argument("--price-per-gpu-hour", type=_price, metavar="USD", help="adds the cost to train")
        p.add_argument(
            "--min-efficiency",
            type=_fraction,
            default=0.7,
            metavar="F",
            help="report where scaling efficiency falls below F (default 0.7)",
        )
        p.add_argument("--plot", metavar="FILE.png", help="write the scaling plot as PNG")
        p.add_argument("--json", action="store_true", help="print one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        model = load_model(args.model)
        seq_len = args.seq_len or default_seq_len(model)
        largest_pow2 = 1 << (max(args.gpus).bit_length() - 1)
        global_batch = args.global_batch or default_global_batch(seq_len, largest_pow2)
        load_gpu(args.gpu or DEFAULT_GPU)  # a misspelt name is bad input (exit 2), not "does not fit"
        for flag, link in (("--intra-node", args.intra_node), ("--inter-node", args.inter_node)):
            if link:
                load_link(link, flag=flag)
        if args.plot:  # before the sweep, not after it
            _check_plot(Path(args.plot))
        result = scale(
            model,
            args.gpus,
            _cluster_at(args),
            space=load_space(args.space),
            global_batch=global_batch,
            seq_len=seq_len,
            tokens=args.tokens,
            price_per_gpu_hour=args.price_per_gpu_hour,
            min_efficiency=args.min_efficiency,
        )
        if args.plot:
            _plot(result, Path(args.plot), args)
        if args.json:
            print(json.dumps({**result.to_dict(), "plot": args.plot}, indent=2))
        else:
            print(_text(result, args))
        return 0


def _cluster_at(args: argparse.Namespace) -> Callable[[int], ClusterSpec]:
    def make(n: int) -> ClusterSpec:
        cluster = cluster_from_flags(args, n)
        return with_profile(cluster, args.profile) if args.profile else cluster

    return make


def _title(result: ScaleResult, args: argparse.Namespace) -> str:
    cluster = next((p.cluster for p in reversed(result.points) if p.cluster), None)
    links = (
        f"{cluster.intra_link.key} in node, {cluster.nics_per_node}x {cluster.inter_link.key} between"
        if cluster
        else ""
    )
    return (
        f"{result.model.name} ({param_count(result.model.num_params)}) on {args.gpu or DEFAULT_GPU}: "
        f"{links}; "
        f"batch {result.global_batch} x {result.seq_len} tokens"
    )


def _check_plot(path: Path) -> None:
    if path.suffix.lower() != ".png":
        raise ConfigError(f"--plot {path}: the plot is a PNG; name it FILE.png")
    if path.is_dir():
        raise ConfigError(f"--plot {path}: is a directory; name a FILE.png")
    check_writable(path.parent, "--plot")


def _plot(result: ScaleResult, path: Path, args: argparse.Namespace) -> None:
    from autotune.report.plots import scaling_png

    pts = result.points
    image = scaling_png(
        _title(result, args),
        [p.num_gpus for p in pts],
        [p.best.tokens_per_s if p.best else None for p in pts],
        [p.efficiency for p in pts],
        [p.shares for p in pts],
        result.min_efficiency,
    )
    try:
        writable_dir(path.parent, "--plot")
        path.write_bytes(image)
    except OSError as e:
        raise ConfigError(f"--plot {path}: cannot write it ({e.strerror})") from None


def _row(p: ScalePoint, result: ScaleResult) -> str:
    nodes = p.cluster.num_nodes if p.cluster else "-"
    if p.best is None:
        return f"{p.num_gpus:>5} {nodes:>5}  {p.status}: {p.detail}"
    best = p.best
    cells = (
        f"{p.num_gpus:>5} {nodes:>5}  {best.tokens_per_s:>11,.0f} {best.tokens_per_s_per_gpu:>8,.0f} "
        f"{p.efficiency or 0:>5.0%} {best.mfu:>6.1%} {gib(best.memory_bytes_per_gpu):>9}"
    )
    if p.train_time_s is not None:
        cells += f" {p.train_time_s / 86400:>8.1f}"
    if p.cost_dollars is not None:
        cells += f" {p.cost_dollars:>12,.0f}"
    return f"{cells}  {plan_summary(best.plan)}"


def _text(result: ScaleResult, args: argparse.Namespace) -> str:
    head = f"{'GPUs':>5} {'nodes':>5}  {'tokens/s':>11} {'per GPU':>8} {'eff':>5} {'MFU':>6} {'mem/GPU':>9}"
    if result.tokens:
        head += f" {'days':>8}"
    if result.tokens and result.price_per_gpu_hour:
        head += f" {'cost $':>12}"
    lines = [_title(result, args), "", head + "  best plan"]
    lines += [_row(p, result) for p in result.points]
    lines.append("")
    fit = result.smallest_fit
    lines.append(f"smallest count that fits: {fit} GPUs" if fit else "no count fits")
    below = result.first_below
    if below is not None:
        lines.append(
            f"efficiency falls below {result.min_efficiency:.0%} at {below.num_gpus} GPUs "
            f"({below.efficiency:.0%}): {below.why}"
        )
    elif fit:
        lines.append(f"efficiency stays at or above {result.min_efficiency:.0%} over the counts that fit")
    lines += _superlinear(result)
    if result.tokens:
        lines.append(f"days: to train on {result.tokens:,.0f} tokens at the predicted throughput")
    if args.plot:
        lines.append(f"plot: {args.plot}")
    return "\n".join(lines)


def _superlinear(result: ScaleResult) -> list[str]:
    """Why efficiency can exceed 100%: the smallest count pays (recompute, offload, ...) to fit."""
    ok = [p for p in result.points if p.best is not None]
    if not ok or max(p.efficiency or 0 for p in ok) <= 1.05:
        return []
    shares = ok[0].shares or {}
    other = {k: v for k, v in shares.items() if k != "compute"}
    term = max(other, key=other.__getitem__)
    return [
        f"efficiency above 100%: at {ok[0].num_gpus} GPUs the best plan spends {sum(other.values()):.0%} "
        f"of its step outside compute (mostly {term}) to fit; more GPUs' memory removes that"
    ]
