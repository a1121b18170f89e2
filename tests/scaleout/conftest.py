"""Fixtures of the scale-out tests: a session-wide local Slurm cluster (``local_slurm.py``), skipped when
Slurm is missing (the hard time limit of ``dist`` tests is tests/conftest.py's)."""

from __future__ import annotations

import os

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
