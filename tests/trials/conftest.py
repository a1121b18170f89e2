"""Fixtures of the real-trial tests, and a hard per-test timeout.

A test marked ``@pytest.mark.dist(timeout=S)`` fails with ``TimeoutError`` after ``S x HANG_FACTOR``
seconds (SIGALRM; pytest-timeout is not installed). Every trial also has the runner's own ``timeout_s``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/distributed.py

from autotune.catalog import load_model  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402

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


@pytest.fixture(scope="session")
def tiny() -> ModelSpec:
    return load_model("tiny")
