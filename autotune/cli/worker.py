"""``autotune worker``: join a study that ``autotune search`` created and run trials in it.

The study describes itself (model and cluster specs, batch, space, backend: ``autotune.scaleout``), so a
worker needs only its name and storage. Create it once, then start one worker per node (or several)::

    URL=postgresql+psycopg2://autotune@db:5432/autotune         # or journal:///nfs/autotune/s1.log
    autotune search --model 70b --gpus 8 --study s1 --storage $URL --create-only
    autotune worker --study s1 --storage $URL --trials 8         # on every node, as many as you like

Workers share the study through the storage: trial numbers come from it, the cost model's top-K is queued
once (by ``--create-only``), and a worker that dies mid-trial has that trial failed and re-queued by the
others after the heartbeat grace period (``--heartbeat``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.join import join_study
from autotune.urls import redact_url as _redact

__all__ = ["WorkerCommand", "create_only"]

_DEFAULT_TRIALS = 16


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def add_study_args(p: argparse.ArgumentParser) -> None:
    """The flags that name a shared study (worker and retune)."""
    from autotune.scaleout import DEFAULT_HEARTBEAT_S

    g = p.add_argument_group("study")
    g.add_argument("--study", required=True, help="name of a study made by autotune search")
    g.add_argument(
        "--storage",
        metavar="URL",
        help="its storage: postgresql+psycopg2://..., "
        "journal:///path, sqlite:///... (default: runs/<study>/study.db)",
    )
    g.add_argument("--out", default="runs", metavar="DIR", help="runs directory (default ./runs)")
    g.add_argument(
        "--heartbeat",
        type=int,
        default=DEFAULT_HEARTBEAT_S,
        metavar="S",
        help=f"heartbeat period of running trials, seconds (default {DEFAULT_HEARTBEAT_S}); "
        "a dead worker's trial is failed and re-queued after 3 periods",
    )


class WorkerCommand:
    help = "Join a study (made by autotune search) and run trials in it; the study says what to run."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_study_args(p)
        g = p.add_argument_group("trials")
        g.add_argument(
            "--trials",
            type=_count,
            default=_DEFAULT_TRIALS,
            help=f"trials this worker launches (default {_DEFAULT_TRIALS})",
        )
        g.add_argument("--timeout", type=float, metavar="S", help="stop launching trials after S seconds")
        g.add_argument("--quiet", action="store_true", help="print only the summary line")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.search import StudyOptions, run_study

        if args.timeout is not None and not args.timeout > 0:
            raise ConfigError(f"--timeout {args.timeout:g}: expected seconds > 0")
        joined = join_study(args.study, args.storage, Path(args.out), heartbeat_s=args.heartbeat)
        log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
        options = StudyOptions(n_trials=args.trials, timeout_s=args.timeout, top_k=0)
        launched = run_study(
            joined.study, joined.ranking, joined.backend, options, trials_dir=joined.study_dir.trials, log=log
        )
        print(
            f"worker {socket.gethostname()}:{os.getpid()}: launched {launched} trial(s) in study "
            f"'{args.study}' ({_redact(joined.url)}); the study has {len(joined.study.trials)} trials"
        )
        return 0


def create_only(study: Any, ranking: Any, backend: Any, *, top_k: int, url: str, out: str) -> int:
    """``autotune search --create-only``: create the study, queue the cost model's top-K, run no trial."""
    from autotune.search import StudyOptions, run_study

    run_study(study, ranking, backend, StudyOptions(n_trials=0, top_k=top_k), trials_dir=Path(out))
    storage = "" if url.startswith("sqlite:") else f" --storage {_redact(url)}"
    print(
        f"study '{study.study_name}' is ready ({_redact(url)}): {_waiting(study)} plan(s) queued. Join it "
        f"from each node with:\n  autotune worker --study {study.study_name}{storage} --out {out}"
    )
    return 0


def _waiting(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
