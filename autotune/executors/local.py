"""``local``: one torchrun agent on this machine, as ``autotune.trials.runner.run_trial`` always did."""

from __future__ import annotations

from autotune.trials.config import TrialConfig
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult
from autotune.trials.runner import Launch, run_trial

__all__ = ["LocalExecutor"]


class LocalExecutor:
    name = "local"

    def __init__(self, *, launch: Launch | None = None) -> None:
        self.launch = launch or Launch()

    def run(
        self, request: TrialRequest, *, config: TrialConfig, report: ReportFn | None = None
    ) -> TrialResult:
        return run_trial(request, report=report, launch=self.launch, config=config)
