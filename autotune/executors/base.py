"""The executor interface: run one prepared trial somewhere and classify how it ended."""

from __future__ import annotations

from typing import Protocol

from autotune.trials.config import TrialConfig
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult

__all__ = ["Executor"]


class Executor(Protocol):
    name: str

    def run(
        self, request: TrialRequest, *, config: TrialConfig, report: ReportFn | None = None
    ) -> TrialResult:
        """Launch the trial in ``request.trial_dir``, stop it at ``request.timeout_s`` or when ``report``
        asks, and return its result (also written to ``result.json``); never raises for a failed trial."""
        ...
