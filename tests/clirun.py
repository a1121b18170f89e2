"""Running ``autotune`` from a test, in process or as a subprocess; the one-line error the CLI promises."""

from __future__ import annotations

import os
import subprocess
import sys

from autotune.cli import main

SIMULATE = ["--backend", "simulate", "--top", "1"]
"""Flags of a search that predicts its one trial instead of measuring it."""


def run_cli(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def run_autotune(*argv, cwd, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "autotune", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
