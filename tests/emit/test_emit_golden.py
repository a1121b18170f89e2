"""Golden files: the configuration artefacts of every named plan, byte for byte.

After an intended change, regenerate with ``AUTOTUNE_UPDATE_GOLDEN=1 pytest tests/emit/test_emit_golden.py``
and review the diff of ``tests/golden/emit/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from emit_cases import CASES

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "emit"
PINNED = (
    "ds_config.json",
    "accelerate_fsdp.yaml",
    "torchrun_args.txt",
    "torchtitan.toml",
    "megatron_args.txt",
)


@pytest.mark.parametrize("name", list(CASES))
def test_artefacts_match_golden(name, emitted):
    out, golden = emitted(name), GOLDEN / name
    produced = {f: (out / f).read_text() for f in PINNED if (out / f).exists()}
    if os.environ.get("AUTOTUNE_UPDATE_GOLDEN"):
        golden.mkdir(parents=True, exist_ok=True)
        for stale in golden.iterdir():
            stale.unlink()
        for filename, text in produced.items():
            (golden / filename).write_text(text)
    expected = {p.name: p.read_text() for p in golden.iterdir()} if golden.exists() else {}
    assert sorted(produced) == sorted(expected), "artefacts differ from the golden set"
    for filename, text in produced.items():
        assert text == expected[filename], f"{name}/{filename} differs from tests/golden/emit"
