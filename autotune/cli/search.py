"""``autotune search``: rank every legal plan with the cost model, then measure the best in an Optuna study.

Examples::

    autotune search --model 70b --gpus 16                        # plan here, measure on the cluster
    autotune search --model 70b --gpus 16 --tp 8 --trials 24      # pin TP; 24 real trials where GPUs exist
    autotune search --model 70b --gpus 16 --study s1 --resume     # add trials to study s1
    autotune search --model tiny --gpus 4 --device cpu --trials 3 --global-batch 16  # gloo, on a laptop
    autotune search --model 70b --gpus 64 --executor slurm --trials 16  # each trial a Slurm job (or step)
    autotune search --model 70b --gpus 16 --study s1 --storage URL --create-only  # then: autotune worker
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autotune.cli._args import add_model_cluster_args, add_plan_args, implied_framework, resolve_model_cluster
from autotune.cli._notes import batch_notes
from autotune.cli._runnable import runnable_fallback
from autotune.cli._searchplans import (
    CPU_SEQUENCES_PER_PROCESS,
    check_search_study,
    choose_and_rank,
    open_search_study,
)
from autotune.cli._searchreport import search_report, search_summary, trial_row
from autotune.costmodel import Estimate, estimate
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM, MAX_MEMORY_HEADROOM
from autotune.plan import ParallelPlan
from autotune.preflight import check_writable
from autotune.progress import SearchProgress, wants_progress
from autotune.render import plan_summary
from autotune.specs import ClusterSpec, ModelSpec
from autotune.trialrecord import record_of

__all__ = ["SearchCommand"]

_DEFAULT_MEASURED_TRIALS = 16


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_MEMORY_HEADROOM:
        raise argparse.ArgumentTypeError(
            f"expected a fraction from 0 to {MAX_MEMORY_HEADROOM:g}, got {text!r}"
        )
    return value


class SearchCommand:
    help = "Find the fastest plan: rank all legal plans with the cost model, then measure the best (Optuna)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_model_cluster_args(p)
        add_plan_args(p, pinning=True)
        g = p.add_argument_group("search")
        g.add_argument(
            "--space",
            metavar="FILE",
            help="search space YAML, or a bundled one: default, fsdp, "
            "deepspeed, megatron (default: search_spaces/default.yaml)",
        )
        g.add_argument(
            "--trials",
            type=_count,
            help=f"trials to launch in this run (default: "
            f"{_DEFAULT_MEASURED_TRIALS} measured; with predictions only, the top-K)",
        )
        g.add_argument("--timeout", type=float, metavar="S", help="stop launching trials after S seconds")
        g.add_argument(
            "--top",
            type=_count,
            default=5,
            metavar="K",
            help="the cost model's K best plans are tried first; rows shown (default 5)",
        )
        g.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
        g.add_argument(
            "--recalibrate",
            action="store_true",
            help="refit the cost model to the trials after "
            "every measured one and let it pick the next plan (autotune.calibrate.Refiner)",
        )
        g.add_argument("--study", help="study name (default: <model>-<gpus>x<gpu>)")
        g.add_argument("--storage", metavar="URL", help="Optuna storage URL (default: SQLite in its dir)")
        g.add_argument("--resume", action="store_true", help="add trials to the existing study of this name")
        g.add_argument("--force", action="store_true", help="replace an existing study of this name")
        g.add_argument(
            "--create-only",
            action="store_true",
            help="create the study and queue the top-K, run no trial: `autotune worker` processes join it",
        )
        g.add_argument(
            "--heartbeat",
            type=int,
            default=30,
            metavar="S",
            help="heartbeat period of running "
            "trials (default 30 s); a dead process's trial is failed and re-queued 3 periods on",
        )
        g.add_argument(
            "--backend",
            choices=("auto", "simulate", "torchrun", "deepspeed"),
            default="auto",
            help="auto: real trials when this node has the GPUs (or --device cpu), else predictions",
        )
        g.add_argument(
            "--executor",
            choices=("local", "multinode", "slurm"),
            default="local",
            help="where trials run: local (this node), slurm (an sbatch job per trial; srun steps "
            "inside an allocation), multinode (one agent per node, all here on loopback)",
        )
        g.add_argument(
            "--workload",
            metavar="MODULE:FUNC",
            help="your model in the trials: build(spec, "
            "plan, device) -> autotune.workload.Workload (examples/custom_workload)",
        )
        g.add_argument(
            "--script",
            metavar="FILE",
            help="your training script, run by torchrun in each "
            "trial; it reads the plan, reports through autotune.contract (examples/train_script)",
        )
        g.add_argument(
            "--device",
            choices=("cpu", "cuda"),
            help="cpu: gloo trials on CPU processes (global "
            f"batch default: {CPU_SEQUENCES_PER_PROCESS} sequences per process)",
        )
        g.add_argument("--out", default="runs", metavar="DIR", help="runs directory (default ./runs)")
        g.add_argument("--json", action="store_true", help="print one JSON object")
        g.add_argument("--quiet", action="store_true", help="print only the best plan (no progress bars)")
        g.add_argument(
            "--memory-headroom",
            type=_headroom,
            default=DEFAULT_MEMORY_HEADROOM,
            metavar="F",
            help="share of GPU memory the recommended plan leaves free "
            f"(default {DEFAULT_MEMORY_HEADROOM:g}; docs/memory_headroom.md)",
        )

    def run(self, args: argparse.Namespace) -> int:
        import optuna  # here, so that `autotune estimate` never imports it

        from autotune.cli.worker import create_only
        from autotune.scaleout import describe_study, make_setup
        from autotune.search import StudyOptions, run_study, top_trials

        _check_args(args)
        model, cluster = resolve_model_cluster(args)
        _check_precision(args, cluster)
        check_writable(args.out, "--out")
        check_search_study(args, model, cluster)  # before the ranking: minutes on a large cluster
        with SearchProgress(enabled=wants_progress(quiet=args.quiet)) as progress:  # bars on a TTY only
            choice, ranking = choose_and_rank(args, model, cluster, on_ladder=progress.ladder_judged)
            for line in batch_notes(
                model,
                cluster,
                ranking.ctx,
                global_batch_given=bool(args.global_batch),
                seq_len_given=bool(args.seq_len),
            ):
                note(line)
            progress.ranked(len(ranking.feasible))
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study, study_dir, url = open_search_study(args, model, cluster, ranking)
            describe_study(
                study,
                make_setup(
                    model=model,
                    cluster=cluster,
                    ctx=ranking.ctx,
                    seed=args.seed,
                    backend=args.backend,
                    device=args.device,
                    measures=choice.backend.measures,
                    executor=args.executor,
                    workload=args.workload,
                    script=args.script,
                ),
            )
            if args.create_only:
                return create_only(study, ranking, choice.backend, top_k=args.top, url=url, out=args.out)
            measured = choice.backend.measures
            default_trials = _DEFAULT_MEASURED_TRIALS if measured else max(args.top, 1)
            options = StudyOptions(
                n_trials=args.trials if args.trials is not None else default_trials,
                timeout_s=args.timeout,
                top_k=args.top,
            )
            log = None if args.quiet or args.json else (lambda line: print(line, file=sys.stderr))
            if progress.enabled:
                log = lambda line: progress.trial_done(line, study)  # noqa: E731
                if choice.note:
                    progress.note(choice.note)
                progress.start_trials(options.n_trials)
            elif log and choice.note:
                log(choice.note)
            refine = _refiner(ranking) if args.recalibrate and measured else None
            launched = run_study(
                study, ranking, choice.backend, options, trials_dir=study_dir.trials, log=log, refine=refine
            )
        top = top_trials(study, max(args.top, 1))
        if not top:
            where = (
                f"see {study_dir.trials}/*/stderr.log"
                if any(study_dir.trials.glob("*/stderr.log"))
                else "none has run yet"
            )
            print(
                f"autotune search: no trial succeeded in study '{study.study_name}'; {where}", file=sys.stderr
            )
            return 1
        best_plan = record_of(top[0]).parallel_plan
        assert best_plan is not None  # a finished trial was judged with its plan
        best_est = estimate(model, cluster, best_plan)
        emitted = _emit(
            best_plan,
            model,
            cluster,
            best_est,
            study_dir.best,
            [trial_row(t) for t in top] if measured else None,
        )
        out = search_summary(best_est, top, study, url, ranking, emitted, launched, measured, choice.note)
        if emitted is not None:
            out.update(
                runnable_fallback(best_plan, best_est.tokens_per_s, ranking, model, cluster, study_dir.root)
            )
        out.update(
            model=model.name, cluster=cluster.name, num_gpus=cluster.num_gpus, study_dir=str(study_dir.root)
        )
        if measured:  # fit the cost model to the measured trials (autotune calibrate does it on demand)
            out["calibration"] = _calibrate(study, model, cluster, study_dir.root)
        study_dir.summary.write_text(json.dumps(out, indent=2) + "\n")
        if args.json:
            print(json.dumps(out, indent=2))
        elif args.quiet:
            print(f"best: {plan_summary(best_plan)}  {top[0].value:,.0f} tokens/s ({out['value_source']})")
        else:
            print(search_report(out, model, cluster, ranking))
        return 0


def _check_args(args: argparse.Namespace) -> None:
    """Flags that contradict each other or ask for nothing, and the defaults other flags imply (noted)."""
    from autotune.store import check_study_name

    if args.resume and args.force:
        raise ConfigError("--resume keeps the study and --force replaces it: pass one")
    if args.trials == 0 and not (args.resume or args.create_only):
        raise ConfigError(
            "--trials 0 runs nothing: pass --trials N (N >= 1), or --create-only to only "
            "create the study (--resume --trials 0 reports an existing one)"
        )
    if args.timeout is not None and not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout:g}: expected seconds > 0")
    if args.study is not None:
        check_study_name(args.study)
    if args.device == "cpu" and args.gpu is None and not args.cluster:
        args.gpu = "cpu"
        note("--device cpu: the trials are priced as the catalog's 'cpu' (pass --gpu to plan for another)")
    framework = implied_framework(args.sharding)
    if args.framework is None and framework is not None:
        args.framework = framework
        note(f"--sharding {args.sharding}: only {framework} offers it, so --framework {framework}")


def _check_precision(args: argparse.Namespace, cluster: ClusterSpec) -> None:
    if args.precision and not cluster.gpu.supports(args.precision):
        raise ConfigError(
            f"--precision {args.precision}: {cluster.gpu.key} has no {args.precision} tensor "
            "cores; use bf16, or a GPU that has them"
        )


def note(text: str) -> None:
    print(f"autotune search: note: {text}", file=sys.stderr)


def _emit(
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    est: Estimate,
    out_dir: Path,
    measured: list[dict[str, Any]] | None = None,
) -> list[str] | None:
    """Launch files for the best plan (``autotune.emit``); None while that package is not installed."""
    try:
        from autotune.emit import emit_all  # INTEGRATION POINT: autotune/emit (another issue)
    except ImportError as e:
        if e.name and not e.name.startswith("autotune.emit"):
            raise
        return None
    return [str(p) for p in emit_all(plan, model, cluster, est, out_dir, force=True, measured=measured)]


def _refiner(ranking: Any) -> Any:
    from autotune.calibrate import Refiner

    return Refiner(ranking)


def _calibrate(study: Any, model: ModelSpec, cluster: ClusterSpec, root: Path) -> dict[str, Any] | None:
    from autotune.calibrate import calibrate_study

    return calibrate_study(study, model, cluster, root)
