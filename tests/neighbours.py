"""The lock behind tests/conftest.py's ``alone`` marker: who may run beside whom, across xdist workers.

Two ``flock`` files in a directory the run's workers share. Every test passes the ``gate``; an ``alone``
test holds it while it takes the ``room`` exclusively (it waits for the tests inside to end and no new one
enters), the others take the room shared and let the gate go, so a waiting ``alone`` test is not starved.
A crashed worker's locks go with its process.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def room(shared: Path, *, alone: bool) -> Iterator[None]:
    """Held while a test runs: alone, or beside the other non-``alone`` tests."""
    with open(shared / "alone.gate", "a") as gate, open(shared / "alone.room", "a") as hall:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(hall, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases the locks
