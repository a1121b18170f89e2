"""Shared studies: a storage by URL, heartbeats around ask/tell trials, and a study that describes itself.

Storage URLs (``--storage``)::

    sqlite:///runs/<study>/study.db                 the default: one host, a local disk
    postgresql+psycopg2://user@host:5432/db         several nodes (any URL Optuna's RDBStorage takes)
    journal:///nfs/autotune/<study>.log             Optuna's JournalStorage over one file: an NFS-only cluster

The schema and the study are created once, by ``autotune search`` (``--create-only`` to create and enqueue
the cost model's top-K without running a trial); ``autotune worker`` only joins, so workers never race to
create a fresh schema.

Heartbeats: a launched trial is RUNNING in the study while its subprocess runs. If the process that asked
for it dies (SIGKILL, a preempted node), nobody tells it, so each trial is kept alive by a heartbeat thread
(every ``heartbeat_s``) and every worker fails the trials whose heartbeat is older than the grace period
(``GRACE_FACTOR x heartbeat_s``) before it asks for a new one; a trial whose process ran on this host (and
PID namespace) and is gone is failed at once (``--resume`` right after a SIGKILL needs no grace). A
failed trial is re-queued (WAITING, same plan) by ``requeue`` (Optuna's ``RetryHeartbeatStaleTrialCallback``
less the failed try's constraints), at most ``MAX_RETRY`` times. RDB storages use Optuna's own heartbeat
table (database clock); ``JournalStorage`` has none, so a journal trial carries its heartbeat in a system
attribute (the hosts' clocks must agree to well within the grace period).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from autotune.errors import ConfigError
from autotune.hostprofile import HostProfile
from autotune.specs import ClusterSpec, GPUSpec, LinkSpec, ModelSpec
from autotune.trials.orphans import start_ticks as _start_ticks
from autotune.trials.orphans import this_host as _host
from autotune.urls import redact_url

__all__ = [
    "DEFAULT_HEARTBEAT_S",
    "GRACE_FACTOR",
    "MAX_RETRY",
    "SETUP_ATTR",
    "open_storage",
    "beat",
    "keep_alive",
    "fail_stale",
    "owner_dead_here",
    "requeue",
    "storage_error",
    "redact_url",
    "describe_study",
    "study_setup",
    "make_setup",
    "model_from_dict",
    "cluster_from_dict",
]

DEFAULT_HEARTBEAT_S = 30
"""A RUNNING trial's heartbeat period; a dead worker's trial is failed ``GRACE_FACTOR`` periods later."""
GRACE_FACTOR = 3
MAX_RETRY = 2
"""A trial whose worker died is run again at most this many times (a plan that kills its worker fails)."""
SETUP_ATTR = "autotune_setup"
"""Study user attr: model and cluster specs, batch, backend... everything a worker needs to join."""
_JOURNAL_BEAT = "autotune_heartbeat"
_OWNER = "autotune_owner"
_ASK_WARNING = "Heartbeat of storage is supposed to be used with Study.optimize"


def open_storage(
    url: str,
    *,
    heartbeat_s: int | None = DEFAULT_HEARTBEAT_S,
    engine_kwargs: dict[str, Any] | None = None,
    create: bool = True,
) -> BaseStorage:
    """The Optuna storage a URL names; RDB storages get heartbeats (``heartbeat_s=None``: none).

    ``create=False`` (workers) never creates the schema: only the study's creator does.
    """
    if heartbeat_s is not None and heartbeat_s < 1:
        raise ConfigError(f"--heartbeat {heartbeat_s}: expected a whole number of seconds >= 1")
    if url.startswith("journal://"):
        path = url.removeprefix("journal://")
        if not path.startswith("/"):
            raise ConfigError(
                f"--storage {url}: a journal URL needs an absolute path (journal:///dir/file.log)"
            )
        try:
            return _Journal(JournalFileBackend(path), heartbeat_s)
        except OSError as e:
            raise storage_error(url, e) from None
    if "://" not in url:
        raise ConfigError(
            f"--storage {url!r}: expected a URL (sqlite:///..., postgresql+psycopg2://..., journal:///...)"
        )
    kwargs: dict[str, Any] = {
        "engine_kwargs": engine_kwargs or {"pool_pre_ping": True},
        "skip_table_creation": not create,
    }
    if heartbeat_s is not None:
        kwargs.update(
            heartbeat_interval=heartbeat_s,
            grace_period=GRACE_FACTOR * heartbeat_s,
            heartbeat_stale_trial_callback=requeue,
        )
        # ask/tell is our loop (trials are subprocesses); keep_alive() beats for it, as optimize() would
        warnings.filterwarnings("ignore", message=_ASK_WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for attempt in range(3):  # creators racing on a new schema retry (``_lost_schema_race``)
            try:
                return RDBStorage(url, **kwargs)
            except (ImportError, ValueError) as e:  # unknown dialect or driver
                raise ConfigError(f"--storage {redact_url(url)}: {e}") from None
            except (SQLAlchemyError, optuna.exceptions.StorageInternalError, OSError) as e:
                if not (create and _lost_schema_race(e)) or attempt == 2:
                    raise storage_error(url, e) from None
                time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _lost_schema_race(error: BaseException) -> bool:
    """Another process created Optuna's schema at the same moment (a table "already exists", or its version
    rows hit our unique key first); opening again finds them and goes on."""
    causes = (error, error.__cause__)
    lost_create = any(isinstance(e, OperationalError) and "already exists" in str(e) for e in causes)
    return lost_create or any(isinstance(e, IntegrityError) for e in causes)


def storage_error(url: str, error: BaseException) -> ConfigError:
    """One line for a storage that cannot be opened or used: unreachable, no such path, no such dialect."""
    text = str(error.__cause__ or error).strip()
    cause = text.splitlines()[0][:200] if text else type(error).__name__
    return ConfigError(
        f"--storage {redact_url(url)}: cannot use it ({cause}); is the database up, the path "
        "there and writable, and the URL one of sqlite:///, postgresql+psycopg2://, journal:///?"
    )


class _Journal(JournalStorage):
    """A ``JournalStorage`` that remembers the heartbeat period its workers use (journal has no table)."""

    def __init__(self, backend: JournalFileBackend, heartbeat_s: int | None) -> None:
        super().__init__(backend)
        self.autotune_heartbeat_s = heartbeat_s


def _beat_period(storage: Any) -> tuple[int | None, bool]:
    """(heartbeat period, whether Optuna's own heartbeat table is used) of a study's storage."""
    if isinstance(storage, _Journal):
        return storage.autotune_heartbeat_s, False
    interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
    return interval, True


def beat(study: optuna.Study, trial: optuna.Trial) -> None:
    """Right after ``ask``: the trial's owner (host, pid, process start) and one heartbeat, so it is found
    dead from its first moment (its process may die before it launches anything)."""
    study._storage.set_trial_system_attr(trial._trial_id, _OWNER, _me())
    beater = _beater(study, trial)
    if beater is not None:
        beater[0]()


def _me() -> str:
    return f"{_host()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def owner_dead_here(trial: FrozenTrial) -> bool:
    """The process that ran ``trial`` was on this host and is gone (its trial processes may not be)."""
    owner = trial.system_attrs.get(_OWNER)
    return owner is not None and _dead_here(owner)


def _dead_here(owner: str) -> bool:
    """The trial's process ran on this host and is gone (no heartbeat grace needed to know it)."""
    host, pid, ticks = owner.rsplit(":", 2)
    return host == _host() and "/?" not in host and ticks != "None" and _start_ticks(int(pid)) != ticks


def _beater(study: optuna.Study, trial: optuna.Trial) -> tuple[Any, int] | None:
    """(a function that records one heartbeat for ``trial``, the period); None when heartbeats are off."""
    storage: Any = study._storage
    period, native = _beat_period(storage)
    if period is None:
        return None
    trial_id = trial._trial_id

    def beat_now() -> None:
        if native:
            storage.record_heartbeat(trial_id)
        else:
            storage.set_trial_system_attr(
                trial_id, _JOURNAL_BEAT, {"time": time.time(), "grace_s": GRACE_FACTOR * period}
            )

    return beat_now, period


@contextmanager
def keep_alive(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for ``trial`` while the block runs (its trial subprocess); nothing when heartbeats are off.

    Optuna's ask/tell API has no heartbeat hook (only ``optimize`` starts one), so this reaches the study's
    storage and the trial id, as ``optuna.study._optimize`` does.
    """
    beater = _beater(study, trial)
    if beater is None:
        yield
        return
    beat_now, period = beater
    stop = threading.Event()
    beat_now()
    thread = threading.Thread(
        target=_beat_until,
        args=(beat_now, period, stop),
        daemon=True,
        name=f"autotune-heartbeat-{trial.number}",
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _beat_until(beat: Any, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        try:
            beat()
        except (optuna.exceptions.UpdateFinishedTrialError, OSError, SQLAlchemyError):
            pass  # the trial was finished meanwhile, or the database blinked: the next beat decides


def fail_stale(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials whose process is dead and re-queue their plans: a process of this host that
    is gone (found at once, e.g. by ``--resume`` after a SIGKILL), or a heartbeat older than its grace.

    Returns the numbers of the trials failed here (another worker may fail the same trial first).
    """
    period, native = _beat_period(study._storage)
    failed = []
    if native and period is not None:
        before = _failed(study)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        failed = sorted(_failed(study) - before)
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner, beat_ = trial.system_attrs.get(_OWNER), trial.system_attrs.get(_JOURNAL_BEAT)
        late = beat_ is not None and not native and now - beat_["time"] > beat_["grace_s"]
        if (late or (owner is not None and _dead_here(owner))) and _fail_and_retry(study, trial):
            failed.append(trial.number)
    return failed


def _fail_and_retry(study: optuna.Study, trial: FrozenTrial) -> bool:
    storage: Any = study._storage
    try:
        if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:  # told meanwhile, or another worker failed it first
        return False
    requeue(study, storage.get_trial(trial._trial_id))
    return True


def requeue(study: optuna.Study, trial: FrozenTrial, *, charged: bool = True) -> None:
    """Queue a failed trial's plan again (WAITING; ``failed_trial`` names the first try), at most
    ``MAX_RETRY`` times: Optuna's ``RetryHeartbeatStaleTrialCallback``, without the constraints and owner of
    the failed try (the retry sets its own; Optuna warns when a constraint is set twice). A try the user
    stopped with a signal (``charged=False``) is not the plan's fault and does not count toward the limit."""
    history = [*trial.system_attrs.get("retry_history", []), *([trial.number] if charged else [])]
    if len(history) > MAX_RETRY:
        return
    system = {
        k: v
        for k, v in trial.system_attrs.items()
        if not k.startswith("constraints:") and k not in (_OWNER, _JOURNAL_BEAT)
    }
    system |= {"failed_trial": trial.system_attrs.get("failed_trial", trial.number), "retry_history": history}
    study.add_trial(
        optuna.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs=trial.user_attrs,
            system_attrs=system,
        )
    )


def _failed(study: optuna.Study) -> set[int]:
    return {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}


# ---------------------------------------------------------------------------------------------- setup
def describe_study(study: optuna.Study, setup: dict[str, Any]) -> None:
    """Store what a worker needs to join (once: the creator's description stands)."""
    if SETUP_ATTR not in study.user_attrs:
        study.set_user_attr(SETUP_ATTR, setup)


def study_setup(study: optuna.Study) -> dict[str, Any]:
    setup = study.user_attrs.get(SETUP_ATTR)
    if setup is None:
        raise ConfigError(
            f"study '{study.study_name}' does not describe itself (no '{SETUP_ATTR}': made by "
            "an older autotune, or not by autotune); recreate it with autotune search"
        )
    return setup  # type: ignore[no-any-return]


def spec_dict(spec: ModelSpec | ClusterSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def model_from_dict(data: dict[str, Any]) -> ModelSpec:
    return ModelSpec(**data)


_HOST_FIELDS = frozenset(f.name for f in dataclasses.fields(HostProfile))


def cluster_from_dict(data: dict[str, Any]) -> ClusterSpec:
    def link(d: dict[str, Any]) -> LinkSpec:
        return LinkSpec(**{**d, "sources": tuple(d.get("sources", ()))})

    return ClusterSpec(
        **{
            **data,
            "gpu": _gpu_from_dict(data["gpu"]),
            "intra_link": link(data["intra_link"]),
            "inter_link": link(data["inter_link"]),
        }
    )


def _gpu_from_dict(data: dict[str, Any]) -> GPUSpec:
    """A GPUSpec from ``spec_dict``; a study written before ``HostProfile`` keeps its fields flat in it."""
    fields = dict(data)
    flat = {k: fields.pop(k) for k in list(fields) if k in _HOST_FIELDS}
    host = {**flat, **(fields.pop("host", None) or {})}
    host["pipeline_action_overhead_s"] = tuple(
        (str(s), float(v)) for s, v in host.get("pipeline_action_overhead_s", ())
    )
    return GPUSpec(**{**fields, "sources": tuple(fields.get("sources", ())), "host": HostProfile(**host)})


def make_setup(
    *,
    model: ModelSpec,
    cluster: ClusterSpec,
    ctx: Any,
    backend: str,
    device: str | None,
    measures: bool,
    seed: int,
    executor: str = "local",
    workload: str | None = None,
    script: str | None = None,
) -> dict[str, Any]:
    """The study's self-description: ``autotune worker`` and ``autotune retune`` rebuild the search from it.

    ``backend`` is what was asked for, except that ``auto`` which only planned here is recorded as
    ``simulate``: a study's values are all measured or all predicted. ``executor``, ``workload`` and
    ``script`` are the search's ``--executor``/``--workload``/``--script`` (a worker needs the same module or
    file path where it runs).
    """
    return {
        "model": spec_dict(model),
        "cluster": spec_dict(cluster),
        "global_batch": ctx.global_batch,
        "seq_len": ctx.seq_len,
        "dp": ctx.dp,
        "routing": ctx.routing(),
        "stored": ctx.stored_json(),
        "backend": backend if backend != "auto" or measures else "simulate",
        "device": device,
        "measures": measures,
        "seed": seed,
        "executor": executor,
        "workload": workload,
        "script": script,
    }
