"""Processes that create one new Optuna schema at the same moment all open it: the ones that lose the race
(a table made between their check and their ``CREATE TABLE``, or the version row's unique key taken) open it
again instead of failing. Seen on SQLite in the full CI before the retry (4 creators: 3-5 of 32 failed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_OPEN = "import sys; from autotune.scaleout import open_storage; open_storage(sys.argv[1], create=True)"


@pytest.mark.dist(timeout=120)
def test_creators_racing_on_a_new_schema_all_open_it(tmp_path):
    for round_ in range(4):
        url = f"sqlite:///{tmp_path}/r{round_}.db"
        procs = [
            subprocess.Popen([sys.executable, "-c", _OPEN, url], stderr=subprocess.PIPE, text=True)
            for _ in range(4)
        ]
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, errors
