"""Tier 3: ``autotune search`` with real trials on 2 CPU ranks (gloo), through the command line.

The first trial crashes (an injected fault); the search records it and goes on, the others measure, each
reporting per-step tokens/s to Optuna while it runs, and the best measured plan is emitted with its
measured and predicted tokens/s side by side.
"""

from __future__ import annotations

import contextlib
import io
import json

import optuna
import pytest

from autotune.backends.torchrun import TorchrunBackend
from autotune.cli import main
from autotune.trials.config import FAULT_ENV


@pytest.mark.dist(timeout=90)
def test_a_short_real_cpu_search_measures_and_survives_a_failed_trial(tmp_path, monkeypatch):
    real_run, calls = TorchrunBackend.run, []

    def first_crashes(self, request, report=None):
        calls.append(request.trial_dir)
        with monkeypatch.context() as m:  # the workers inherit the search's environment
            if len(calls) == 1:
                m.setenv(FAULT_ENV, "crash")
            return real_run(self, request, report)

    monkeypatch.setattr(TorchrunBackend, "run", first_crashes)
    out = io.StringIO()
    argv = [
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--gpu",
        "cpu",
        "--device",
        "cpu",
        "--backend",
        "torchrun",
        "--trials",
        "3",
        "--top",
        "3",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        "--study",
        "s",
        "--out",
        str(tmp_path),
        "--json",
    ]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    summary = json.loads(out.getvalue())
    assert summary["value_source"] == "measured"
    assert summary["trials"]["launched_this_run"] == 3 and summary["trials"]["failed"] == 1
    best = summary["top"][0]
    assert best["measured_tokens_per_s"] == summary["best_value_tokens_per_s"] > 0
    assert best["predicted_tokens_per_s"] > 0

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    launched = [t for t in study.trials if t.user_attrs.get("status") not in (None, "infeasible")]
    assert launched[0].user_attrs["status"] == "error" and "injected crash" in launched[0].user_attrs["error"]
    ok = [t for t in launched if t.user_attrs["status"] == "ok"]
    assert ok and all(len(t.intermediate_values) == 5 for t in ok)  # every measured step reported live

    md = (tmp_path / "s" / "best" / "summary.md").read_text()
    assert "## Measured (real trials)" in md
    assert f"| {best['measured_tokens_per_s']:,.0f} | {best['predicted_tokens_per_s']:,.0f} |" in md
