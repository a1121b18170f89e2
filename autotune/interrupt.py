"""SIGINT, SIGTERM and SIGHUP stop a command the same way: as an exception in the main thread.

Slurm, Kubernetes and systemd stop a job with SIGTERM (a closed terminal sends SIGHUP); Python's default
for both is to die at once, which leaves a running trial's torchrun and ranks behind (they lead sessions
of their own). Raised as ``Interrupted`` instead, the signal unwinds through the trial runner's cleanup
(``autotune.trials.runner``: the trial's process groups are stopped) and ``run_study``, which records the
trial as interrupted and queues its plan again for ``--resume``. Only the first signal raises: a second
one while the trial is being stopped is ignored, so the cleanup itself is never cut short.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Interrupted", "signals_interrupt", "held"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_held: list[int] | None = None
"""While ``held`` runs: the stop signals that arrived, raised when it ends."""
_raised = False
"""A stop signal was raised: later ones are ignored while the command stops."""


class Interrupted(KeyboardInterrupt):
    """A stop signal, raised where the main thread was; ``exit_code`` is the shell's ``128 + signal``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block the stop signals raise ``Interrupted`` once; a signal the caller ignores (``nohup``
    ignores SIGHUP) stays ignored. Outside the main thread (no signal handlers there) it does nothing."""
    global _raised
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        global _raised
        if _held is not None:
            _held.append(signum)
        elif not _raised:
            _raised = True
            raise Interrupted(signum)

    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for sig, old in previous.items():
        if old is not signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


@contextmanager
def held() -> Iterator[None]:
    """A stop signal that arrives within the block is raised when the block ends: around starting a trial's
    processes, so that none is started but not yet known to the cleanup that stops them (a signal raised
    inside ``subprocess.Popen`` after its fork leaves the child running, unknown to its caller)."""
    global _held, _raised
    if _held is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    _held = []
    try:
        yield
    finally:
        pending, _held = _held, None
        if pending and not _raised:
            _raised = True
            raise Interrupted(pending[0])
