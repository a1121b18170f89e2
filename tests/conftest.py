"""Suite-wide policy: a hard time limit on every distributed test; under pytest-xdist, a test marked ``alone``
runs with no other beside it; and under CI (``AUTOTUNE_CI_STRICT=1``, set by ``.ci/run``) a skipped test is a
failure.

A test marked ``@pytest.mark.dist(timeout=S)`` fails with ``TimeoutError`` after ``S x HANG_FACTOR`` seconds
(SIGALRM; pytest-timeout is not installed); one marked ``@pytest.mark.dist`` without a timeout gets
``DIST_TIMEOUT_S``. Trials also have the runner's own ``timeout_s``.

``.ci/run`` installs and starts everything the tests need (PostgreSQL, Slurm, psycopg2, torchtitan), so a
skip there means a service or package went missing and a feature went untested: that must turn CI red, not
pass quietly. Only the skips no CI machine can avoid stay skips: they name hardware CI does not have.
The tiers (``-m "not slow and not dist"`` is the inner loop) are in docs/testing.md.
"""

from __future__ import annotations

import os
import signal

import pytest
from neighbours import room

HANG_FACTOR = float(os.environ.get("AUTOTUNE_HANG_FACTOR", "4"))
"""A test's ``dist(timeout=S)`` is what it takes on an idle machine; the limit is S x this, because the limit
is there to catch a hang, never to fail a slow but healthy run (2 shared cores under a load of 8)."""

DIST_TIMEOUT_S = 300
"""``S`` of a ``dist`` test that names none."""


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml): a worker per core this process may use (a CI container's share, not the
    host's count, which is what xdist's own ``auto`` reads); one core gets one worker."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_collection_modifyitems(config, items):
    """``alone`` tests first: at the start the other workers are between short tests, so neither side waits
    long for the other (a worker idles while an ``alone`` test runs or waits for the room)."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is None)  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _neighbours(request, tmp_path_factory):
    """Under pytest-xdist, an ``alone`` test runs with no other test beside it (``neighbours.room``)."""
    if not hasattr(request.config, "workerinput"):  # not an xdist worker: nothing runs beside this test
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent  # the run's directory, above each worker's own
    with room(shared, alone=request.node.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(autouse=True)
def _hard_timeout(request, _neighbours):  # the limit starts once the test may run (``_neighbours``)
    marker = request.node.get_closest_marker("dist")
    seconds = int(marker.kwargs.get("timeout", DIST_TIMEOUT_S) * HANG_FACTOR) if marker else 0
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


# Reasons that stay skips under CI: CI never has a GPU (the issue says so), and systemd is not PID 1 there.
ALLOWED_IN_CI = ("needs a CUDA device", "systemd-analyze is not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("AUTOTUNE_CI_STRICT") != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if any(allowed in reason for allowed in ALLOWED_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under CI, where everything this test needs is installed: {reason}"
