"""Fixtures of the real-trial tests (the hard time limit of ``dist`` tests is tests/conftest.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/distributed.py

from autotune.catalog import load_model  # noqa: E402
from autotune.specs import ModelSpec  # noqa: E402


@pytest.fixture(scope="session")
def tiny() -> ModelSpec:
    return load_model("tiny")
