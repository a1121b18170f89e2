"""Fixtures of the scale-out tests: a hard per-test timeout (``@pytest.mark.dist(timeout=S)``, as in
tests/trials) and a session-wide local Slurm cluster (``local_slurm.py``), skipped when Slurm is missing."""

from __future__ import annotations

import os
import signal

import pytest
from local_slurm import LocalSlurm, missing_requirements

_SLURM_JOB_VARS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_ID")


@pytest.fixture(scope="session")
def slurm():
    """A running local Slurm (``LocalSlurm``); ``SLURM_CONF`` points at it for the session, and variables
    of an enclosing Slurm job are hidden so that trials submit jobs rather than steps."""
    why = missing_requirements()
    if why:
        pytest.skip(why)
    cluster = LocalSlurm()
    cluster.start()
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", *_SLURM_JOB_VARS)}
    os.environ["SLURM_CONF"] = str(cluster.conf)
    for k in _SLURM_JOB_VARS:
        os.environ.pop(k, None)
    try:
        yield cluster
    finally:
        cluster.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

HANG_FACTOR = float(os.environ.get("AUTOTUNE_HANG_FACTOR", "4"))
"""A test's ``dist(timeout=S)`` is what it takes on an idle machine; the limit is S x this, because the limit
is there to catch a hang, never to fail a slow but healthy run (2 shared cores under a load of 8)."""


@pytest.fixture(autouse=True)
def _hard_timeout(request):
    marker = request.node.get_closest_marker("dist")
    seconds = int(marker.kwargs.get("timeout", 0) * HANG_FACTOR) if marker else 0
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"test exceeded its {seconds} s limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
