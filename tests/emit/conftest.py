"""Fixtures for the emitter tests: every case emitted once per session into a folder with a space."""

from __future__ import annotations

from pathlib import Path

import pytest
from emit_cases import CASES

from autotune.emit import emit_all


@pytest.fixture(scope="session")
def emitted(tmp_path_factory: pytest.TempPathFactory):
    """``emitted(name) -> Path``: the folder ``emit_all`` wrote for case ``name`` (built once)."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            plan, model, cluster = CASES[name].build()
            out = tmp_path_factory.mktemp(f"emit {name}")  # a space: scripts must quote their paths
            emit_all(plan, model, cluster, None, out, force=True)
            cache[name] = out
        return cache[name]

    return get
