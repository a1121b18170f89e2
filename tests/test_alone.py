"""tests/conftest.py's ``alone`` marker under pytest-xdist: no other test runs while an ``alone`` one does."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from neighbours import room

TESTS = """
import json, os, time
from pathlib import Path

import pytest

OUT = Path(os.environ["SPANS"])


def _span(name, seconds):
    start = time.time()
    time.sleep(seconds)
    (OUT / f"{name}.json").write_text(json.dumps([start, time.time()]))


@pytest.mark.parametrize("i", range(5))  # the alone test comes mid-way through a worker's share
def test_beside(i):
    _span(f"beside{i}", 0.4)


@pytest.mark.alone
def test_alone():
    _span("alone", 0.6)


@pytest.mark.parametrize("i", range(5, 16))
def test_after(i):
    _span(f"beside{i}", 0.4)
"""


@pytest.mark.slow  # an inner pytest on two xdist workers
def test_nothing_runs_beside_an_alone_test(tmp_path):
    for name in ("conftest.py", "neighbours.py"):
        (tmp_path / name).write_text(Path(__file__).with_name(name).read_text())
    (tmp_path / "test_spans.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: runs alone\n")
    spans = tmp_path / "spans"
    spans.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "worksteal"],
        cwd=tmp_path,
        env={**os.environ, "SPANS": str(spans), "AUTOTUNE_CI_STRICT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    got = {p.stem: json.loads(p.read_text()) for p in spans.glob("*.json")}
    assert len(got) == 17
    (a0, a1) = got.pop("alone")
    assert all(end <= a0 or start >= a1 for start, end in got.values()), (a0, a1, sorted(got.values()))
    # and the others did run side by side: two workers, their spans overlap
    assert any(s0 < e1 and s1 < e0 for s0, e0 in got.values() for s1, e1 in got.values() if s0 != s1)


def _occupy(shared: Path, alone: bool, start_after: float, seconds: float, out: Path, name: str) -> None:
    time.sleep(start_after)
    with room(shared, alone=alone):
        start = time.time()
        time.sleep(seconds)
        (out / f"{name}.json").write_text(json.dumps([start, time.time()]))


def test_an_alone_holder_waits_for_those_inside_and_keeps_newcomers_out(tmp_path):
    """``neighbours.room`` itself, in three processes: two tests inside, an ``alone`` one arriving while
    they run, and a third test arriving while it waits; and two ordinary tests share the room."""
    out = tmp_path / "spans"
    out.mkdir()
    plan = [  # (alone, start after, hold)
        ("inside", False, 0.0, 1.0),
        ("beside", False, 0.0, 1.0),
        ("alone", True, 0.3, 0.5),
        ("late", False, 0.6, 0.2),
    ]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_occupy, args=(tmp_path, a, s, h, out, n)) for n, a, s, h in plan]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    spans = {n: json.loads((out / f"{n}.json").read_text()) for n, *_ in plan}
    assert spans["inside"][0] < spans["beside"][1] and spans["beside"][0] < spans["inside"][1]  # side by side
    assert spans["alone"][0] >= max(spans["inside"][1], spans["beside"][1])  # waited for both to leave
    assert spans["late"][0] >= spans["alone"][1]  # arrived while it waited: let in after it
