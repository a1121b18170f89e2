"""Join a study that ``autotune search`` created: open it and rebuild its search from its own description.

The study stores its model, cluster, batch, space and backend (``autotune.scaleout``), so ``autotune worker``
and ``autotune retune`` need only its name and storage to run more trials in it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError
from autotune.urls import redact_url as _redact

if TYPE_CHECKING:
    import optuna

    from autotune.backends.base import Backend
    from autotune.ranking import Ranking
    from autotune.store import StudyDir

__all__ = ["Joined", "join_study"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Joined:
    """An existing study and the search rebuilt from its own description."""

    study: optuna.Study
    setup: dict[str, Any]
    """The study's self-description (``autotune.scaleout.study_setup``)."""
    ranking: Ranking
    backend: Backend
    url: str
    """The storage URL (unredacted: workers open it)."""
    study_dir: StudyDir


def join_study(name: str, storage: str | None, runs_dir: Path, *, heartbeat_s: int | None) -> Joined:
    """Open an existing study and rebuild its search (ranking, backend) from its own description."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    from autotune.backends.registry import get_backend, trial_options
    from autotune.ranking import rank_plans
    from autotune.scaleout import cluster_from_dict, model_from_dict, open_storage, study_setup
    from autotune.search import make_sampler
    from autotune.space import PlanContext, SearchSpace, resolve_choices, stored_fields
    from autotune.store import StudyDir, default_storage_url

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study_dir = StudyDir(runs_dir / name)
    if storage is None and not study_dir.db.exists():
        raise ConfigError(
            f"no study '{name}' in {runs_dir}: pass --storage URL (the shared study's storage) or --out DIR"
        )
    url = storage or default_storage_url(study_dir)
    try:
        study = optuna.load_study(
            study_name=name,
            storage=open_storage(url, heartbeat_s=heartbeat_s, create=False),
            pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1),
        )
    except KeyError:
        raise ConfigError(
            f"no study '{name}' in {_redact(url)}; create it once with autotune search ... "
            f"--study {name} --storage URL --create-only"
        ) from None
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:  # unreachable, or no schema there
        cause = str(e.__cause__ or e).strip().splitlines()[0][:200]  # (workers never create one)
        raise ConfigError(
            f"cannot read study '{name}' from {_redact(url)}: {cause}; is the database up, and "
            "was the study created (autotune search ... --create-only)?"
        ) from None
    setup = study_setup(study)
    model, cluster = model_from_dict(setup["model"]), cluster_from_dict(setup["cluster"])
    ctx = PlanContext(
        model=model,
        cluster=cluster,
        global_batch=setup["global_batch"],
        seq_len=setup["seq_len"],
        dp=setup["dp"],
        **setup.get("routing", {}),  # studies from before it: dropless and balanced
        **stored_fields(setup.get("stored", {})),  # studies from before it: fp32 throughout
    )
    space = study.user_attrs["autotune_identity"]["space"]  # the study's categorical choices, as JSON
    study_space = SearchSpace(knobs={k: tuple(v) for k, v in space.items()}, source=f"study {name}")
    choices = resolve_choices(study_space, model, cluster)
    ranking = dataclasses.replace(rank_plans(choices, ctx), choices=space)  # suggest exactly those choices
    options = trial_options(workload=setup.get("workload"), script=setup.get("script"))
    choice = get_backend(
        setup["backend"],
        cluster=cluster,
        device=setup["device"],
        options=options,
        executor=setup.get("executor", "local"),
    )
    if setup["measures"] and not choice.backend.measures:
        raise ConfigError(
            f"study '{name}' measures trials ({setup['backend']}); this node can only predict "
            f"({choice.note}): run the worker where the GPUs are"
        )
    # its own seed: workers that start together must not propose the same plans
    study.sampler = make_sampler(setup["seed"] + os.getpid(), len(study.trials))
    return Joined(
        study=study, setup=setup, ranking=ranking, backend=choice.backend, url=url, study_dir=study_dir
    )
