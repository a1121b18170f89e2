"""Fixtures of the real-trial tests, and a hard per-test timeout.

A test marked ``@pytest.mark.dist(timeout=S)`` fails with ``TimeoutError`` after ``S`` seconds (SIGALRM;
pytest-timeout is not installed). Every trial also has the runner's own ``timeout_s``.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/distributed.py

from autotune.catalog import load_model  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402


@pytest.fixture(autouse=True)
def _hard_timeout(request):
    marker = request.node.get_closest_marker("dist")
    seconds = int(marker.kwargs.get("timeout", 0)) if marker else 0
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
