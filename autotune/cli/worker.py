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
import dataclasses
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.urls import redact_url as _redact

__all__ = ["WorkerCommand", "Joined", "join_study", "create_only"]

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
    g.add_argument("--storage", metavar="URL", help="its storage: postgresql+psycopg2://..., "
                   "journal:///path, sqlite:///... (default: runs/<study>/study.db)")
    g.add_argument("--out", default="runs", metavar="DIR", help="runs directory (default ./runs)")
    g.add_argument("--heartbeat", type=int, default=DEFAULT_HEARTBEAT_S, metavar="S",
                   help=f"heartbeat period of running trials, seconds (default {DEFAULT_HEARTBEAT_S}); "
                   "a dead worker's trial is failed and re-queued after 3 periods")


class WorkerCommand:
    help = "Join a study (made by autotune search) and run trials in it; the study says what to run."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_study_args(p)
        g = p.add_argument_group("trials")
        g.add_argument("--trials", type=_count, default=_DEFAULT_TRIALS,
                       help=f"trials this worker launches (default {_DEFAULT_TRIALS})")
        g.add_argument("--timeout", type=float, metavar="S", help="stop launching trials after S seconds")
        g.add_argument("--quiet", action="store_true", help="print only the summary line")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.search import StudyOptions, run_study

        if args.timeout is not None and not args.timeout > 0:
            raise ConfigError(f"--timeout {args.timeout:g}: expected seconds > 0")
        joined = join_study(args.study, args.storage, Path(args.out), heartbeat_s=args.heartbeat)
        log = None if args.quiet else (lambda line: print(line, file=sys.stderr))
        options = StudyOptions(n_trials=args.trials, timeout_s=args.timeout, top_k=0)
        launched = run_study(joined.study, joined.ranking, joined.backend, options,
                             trials_dir=joined.study_dir.trials, log=log)
        print(f"worker {socket.gethostname()}:{os.getpid()}: launched {launched} trial(s) in study "
              f"'{args.study}' ({_redact(joined.url)}); the study has {len(joined.study.trials)} trials")
        return 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Joined:
    study: Any
    setup: dict[str, Any]
    ranking: Any
    backend: Any
    url: str
    study_dir: Any


def join_study(name: str, storage: str | None, runs_dir: Path, *, heartbeat_s: int | None) -> Joined:
    """Open an existing study and rebuild its search (ranking, backend) from its own description."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.backends.registry import get_backend, trial_options
    from autotune.scaleout import cluster_from_dict, model_from_dict, open_storage, study_setup
    from autotune.search import make_sampler, rank_plans
    from autotune.space import PlanContext, SearchSpace, resolve_choices
    from autotune.store import StudyDir, default_storage_url

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_dir = StudyDir(runs_dir / name)
    if storage is None and not study_dir.db.exists():
        raise ConfigError(f"no study '{name}' in {runs_dir}: pass --storage URL (the shared study's storage) "
                          "or --out DIR")
    url = storage or default_storage_url(study_dir)
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat_s=heartbeat_s,
                                                                        create=False),
                                  pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1))
    except KeyError:
        raise ConfigError(f"no study '{name}' in {_redact(url)}; create it once with autotune search ... "
                          f"--study {name} --storage URL --create-only") from None
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:  # unreachable, or no schema there
        cause = str(e.__cause__ or e).strip().splitlines()[0][:200]      # (workers never create one)
        raise ConfigError(f"cannot read study '{name}' from {_redact(url)}: {cause}; is the database up, and "
                          "was the study created (autotune search ... --create-only)?") from None
    setup = study_setup(study)
    model, cluster = model_from_dict(setup["model"]), cluster_from_dict(setup["cluster"])
    ctx = PlanContext(model=model, cluster=cluster, global_batch=setup["global_batch"],
                      seq_len=setup["seq_len"], dp=setup["dp"])
    space = study.user_attrs["autotune_identity"]["space"]  # the study's categorical choices, as JSON
    study_space = SearchSpace(knobs={k: tuple(v) for k, v in space.items()}, source=f"study {name}")
    choices = resolve_choices(study_space, model, cluster)
    ranking = dataclasses.replace(rank_plans(choices, ctx), choices=space)  # suggest exactly those choices
    options = trial_options(workload=setup.get("workload"), script=setup.get("script"))
    choice = get_backend(setup["backend"], cluster=cluster, device=setup["device"], options=options,
                         executor=setup.get("executor", "local"))
    if setup["measures"] and not choice.backend.measures:
        raise ConfigError(f"study '{name}' measures trials ({setup['backend']}); this node can only predict "
                          f"({choice.note}): run the worker where the GPUs are")
    # its own seed: workers that start together must not propose the same plans
    study.sampler = make_sampler(setup["seed"] + os.getpid(), len(study.trials))
    return Joined(study=study, setup=setup, ranking=ranking, backend=choice.backend, url=url,
                  study_dir=study_dir)


def create_only(study: Any, ranking: Any, backend: Any, *, top_k: int, url: str, out: str) -> int:
    """``autotune search --create-only``: create the study, queue the cost model's top-K, run no trial."""
    from autotune.search import StudyOptions, run_study

    run_study(study, ranking, backend, StudyOptions(n_trials=0, top_k=top_k), trials_dir=Path(out))
    storage = "" if url.startswith("sqlite:") else f" --storage {_redact(url)}"
    print(f"study '{study.study_name}' is ready ({_redact(url)}): {_waiting(study)} plan(s) queued. Join it "
          f"from each node with:\n  autotune worker --study {study.study_name}{storage} --out {out}")
    return 0


def _waiting(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
