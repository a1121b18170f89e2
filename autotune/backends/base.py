"""The backend interface: the search is independent of how (or whether) a trial runs."""

from __future__ import annotations

from typing import Protocol

from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult

__all__ = ["Backend"]


class Backend(Protocol):
    name: str
    measures: bool
    """True when results are measured (torchrun, deepspeed); False for ``simulate``."""

    def run(self, request: TrialRequest, report: ReportFn | None = None) -> TrialResult: ...
