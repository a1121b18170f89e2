"""tests/conftest.py's hard limit reaches every ``dist`` test: one naming its timeout and one naming none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HANGS = """
import time

import pytest


@pytest.mark.dist(timeout=1)
def test_named_timeout():
    time.sleep(30)


@pytest.mark.dist
def test_default_timeout():
    time.sleep(30)
"""


@pytest.mark.slow  # two inner tests hang for the 1 s SIGALRM allows
def test_a_hanging_dist_test_fails_with_a_timeout_error(tmp_path):
    for name in ("conftest.py", "neighbours.py"):
        (tmp_path / name).write_text(Path(__file__).with_name(name).read_text())
    (tmp_path / "test_hangs.py").write_text(HANGS)

    # HANG_FACTOR 1: the named 1 s stays 1 s; 0.004: the default DIST_TIMEOUT_S (300 s) becomes 1 s
    def run(name: str, factor: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "AUTOTUNE_HANG_FACTOR": factor, "AUTOTUNE_CI_STRICT": "0"}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    named, default = run("named", "1"), run("default", "0.004")
    for proc in (named, default):
        assert proc.returncode == 1, proc.stdout
        assert "TimeoutError: test exceeded its 1 s limit" in proc.stdout and "1 failed" in proc.stdout
