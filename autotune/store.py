"""Where a search lives: ``runs/<study>/`` and its Optuna storage.

Layout::

    runs/<study>/
      study.json      what the study is for (model, cluster, batch, space): written once, checked on --resume
      study.db        Optuna storage (SQLite) unless --storage URL names another (PostgreSQL, journal file)
      history.jsonl   one record per ``autotune retune`` run (autotune.retune)
      summary.json    the last search's answer (what ``--json`` prints)
      trials/<n>/     one per launched trial: plan.json, cmd.txt, stdout.log, stderr.log, result.json
      best/           launch files of the best plan (``autotune.emit``)

The study is created once, here, before any trial runs (workers that race to create a fresh SQLite or
PostgreSQL schema lose). The default SQLite file runs in WAL mode with ``synchronous=NORMAL``: a commit no
longer waits for fsync (Optuna commits every parameter and attribute, ~25 per trial: 10x faster here), and
a crash loses at most the last commits, never the file. WAL needs all workers on one host and a local disk;
for several nodes pass ``--storage postgresql://...``.

A study's identity is pinned in ``study.json`` and in its user attrs, so reusing a name for another model,
cluster or batch is a ``ConfigError``, never a silently mixed study.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.exc import SQLAlchemyError

from autotune.errors import ConfigError
from autotune.scaleout import DEFAULT_HEARTBEAT_S, open_storage, storage_error
from autotune.specs import ClusterSpec, ModelSpec
from autotune.userfile import writable_dir

__all__ = [
    "StudyDir",
    "study_name_for",
    "default_storage_url",
    "open_study",
    "check_study_name",
    "check_reusable",
]

_IDENTITY_ATTR = "autotune_identity"
_MAX_NAME = 100
_CREATE_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class StudyDir:
    root: Path

    @property
    def marker(self) -> Path:
        return self.root / "study.json"

    @property
    def db(self) -> Path:
        return self.root / "study.db"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def trials(self) -> Path:
        return self.root / "trials"

    @property
    def best(self) -> Path:
        return self.root / "best"


def study_name_for(model: ModelSpec, cluster: ClusterSpec) -> str:
    """The default study name: model, GPU count and type, e.g. ``70b-16xh100-sxm``."""
    path = Path(model.name)
    model_name = path.parent.name if path.name == "config.json" else path.stem
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{model_name}-{cluster.num_gpus}x{cluster.gpu.key}").strip("-")


def default_storage_url(study_dir: StudyDir) -> str:
    return f"sqlite:///{study_dir.db}"


def open_study(
    *,
    name: str,
    runs_dir: Path,
    storage: str | None,
    identity: dict[str, Any],
    resume: bool,
    force: bool,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner | None = None,
    heartbeat_s: int | None = DEFAULT_HEARTBEAT_S,
) -> tuple[optuna.Study, StudyDir, str]:
    """Create the study, or reopen it with ``resume``; ``force`` replaces an existing one.

    Checks everything before writing anything: an existing study without ``resume``/``force``, or one made
    for another model/cluster/batch/space, is a ``ConfigError`` and nothing is touched.
    """
    check_study_name(name)
    study_dir = StudyDir(runs_dir / name)
    url = storage or default_storage_url(study_dir)
    identity = json.loads(json.dumps(identity))  # as it reads back from JSON
    try:
        return _open(
            study_dir,
            url,
            name,
            storage=storage,
            identity=identity,
            resume=resume,
            force=force,
            sampler=sampler,
            pruner=pruner,
            heartbeat_s=heartbeat_s,
        )
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        raise storage_error(url, e) from None


def check_reusable(
    *, name: str, runs_dir: Path, storage: str | None, identity: dict[str, Any], resume: bool, force: bool
) -> None:
    """What ``open_study`` would refuse, told before the plans are ranked (minutes on a large cluster):
    an existing study without ``resume``/``force``, or one made for another model, cluster or batch.
    ``identity`` holds the keys known before ranking; ``open_study`` checks the whole of it again."""
    check_study_name(name)
    if force:
        return
    study_dir = StudyDir(runs_dir / name)
    url = storage or default_storage_url(study_dir)
    try:
        existing = _existing_identity(study_dir, url, name, own_storage=storage is None)
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
        raise storage_error(url, e) from None
    if existing is not None:
        _check_existing(name, study_dir, existing, json.loads(json.dumps(identity)), resume=resume)


def check_study_name(name: str) -> None:
    """A study name is a directory under ``--out``: a plain, short name, never a path."""
    if not name:
        raise ConfigError("--study '': give a name (or leave --study out for <model>-<gpus>x<gpu>)")
    if len(name) > _MAX_NAME:
        raise ConfigError(f"--study: a name of {len(name)} characters; use at most {_MAX_NAME}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(
            f"--study {name!r}: start with a letter or digit, then letters, digits, '.', '_' "
            "and '-' only (a name, not a path: --out DIR says where)"
        )


def _open(
    study_dir: StudyDir,
    url: str,
    name: str,
    *,
    storage: str | None,
    identity: dict[str, Any],
    resume: bool,
    force: bool,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner | None,
    heartbeat_s: int | None,
) -> tuple[optuna.Study, StudyDir, str]:
    existing = _existing_identity(study_dir, url, name, own_storage=storage is None)
    if existing is not None and not force:
        _check_existing(name, study_dir, existing, identity, resume=resume)
    if existing is not None and force:
        _remove(study_dir, url, name, own_storage=storage is None)
    writable_dir(study_dir.root, "--out")
    engine = None if storage else {"creator": partial(_connect_sqlite, study_dir.db)}
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            backend = open_storage(url, heartbeat_s=heartbeat_s, engine_kwargs=engine)  # scaleout: heartbeats
            study = optuna.create_study(
                study_name=name,
                storage=backend,
                load_if_exists=True,
                direction="maximize",
                sampler=sampler,
                pruner=pruner,
            )
            break
        except (ConfigError, SQLAlchemyError):  # another search created the schema at the same moment
            if storage is not None or attempt == _CREATE_ATTEMPTS - 1:  # (only its own SQLite is retried)
                raise
            time.sleep(0.2 * (attempt + 1))
    if _IDENTITY_ATTR not in study.user_attrs:
        study.set_user_attr(_IDENTITY_ATTR, identity)
    _check_same(name, study.user_attrs[_IDENTITY_ATTR], identity)  # a search that created it meanwhile
    if not study_dir.marker.exists():
        tmp = study_dir.root / f".{study_dir.marker.name}.{os.getpid()}"
        tmp.write_text(json.dumps({"study": name, "storage": url, **identity}, indent=2) + "\n")
        tmp.replace(study_dir.marker)
    return study, study_dir, url


def _connect_sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def _existing_identity(
    study_dir: StudyDir, url: str, name: str, *, own_storage: bool
) -> dict[str, Any] | None:
    """What an existing study of this name is for; None when there is none."""
    if study_dir.marker.exists():
        data = json.loads(study_dir.marker.read_text())
        return {k: v for k, v in data.items() if k not in ("study", "storage")}
    if own_storage and study_dir.db.exists():  # another search is creating it now (its marker comes last)
        return _identity_in(url, name, missing=None)
    if study_dir.root.exists() and any(study_dir.root.iterdir()):
        raise ConfigError(
            f"{study_dir.root} exists and is not an autotune study; choose another --study or --out"
        )
    if own_storage:
        return None
    return _identity_in(url, name, missing={"model": "(not an autotune study)"})


def _identity_in(url: str, name: str, *, missing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The identity the study ``name`` in storage ``url`` records; None when there is no such study yet."""
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat_s=None))
    except KeyError:
        return None
    return study.user_attrs.get(_IDENTITY_ATTR, missing)  # type: ignore[no-any-return]


def _check_existing(
    name: str, study_dir: StudyDir, existing: dict[str, Any], identity: dict[str, Any], *, resume: bool
) -> None:
    """An existing study is reopened only with ``resume`` and only for the same model, cluster, batch and
    space (the keys of ``identity``)."""
    _check_same(name, existing, identity)
    if not resume:
        raise ConfigError(
            f"study '{name}' already exists ({study_dir.root}); pass --resume to add "
            "trials to it, --force to start over, or --study NEW"
        )


def _check_same(name: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    for key in new:
        if old.get(key) == new[key]:
            continue
        if key == "space":
            knob = next((k for k in new[key] if old.get(key, {}).get(k) != new[key][k]), "?")
            was = old.get(key, {}).get(knob)
            detail = f"a different search space (knob '{knob}': {was} vs {new[key][knob]})"
        else:
            detail = f"{key} {old.get(key)!r}, this run asks for {new[key]!r}"
        raise ConfigError(
            f"study '{name}' was made for {old.get('model')} on {old.get('cluster')} with "
            f"{detail}; use another --study (or --force to replace it)"
        )


def _remove(study_dir: StudyDir, url: str, name: str, *, own_storage: bool) -> None:
    if not own_storage:
        try:
            optuna.delete_study(study_name=name, storage=open_storage(url, heartbeat_s=None))
        except KeyError:
            pass
    if study_dir.marker.exists():
        shutil.rmtree(study_dir.root)
