"""TrialResult: the structured contract between a trial subprocess and the search.

The worker writes ``result.json`` in its trial directory; the runner reads it (never the logs) and
combines it with how the process ended (exit code, timeout) into a ``TrialResult``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = ["TrialStatus", "TrialResult"]


class TrialStatus(str, Enum):
    OK = "ok"
    OOM = "oom"
    TIMEOUT = "timeout"
    ERROR = "error"
    RENDEZVOUS_ERROR = "rendezvous_error"
    INFEASIBLE = "infeasible"
    """Never launched: the cost model or the plan rules rejected it."""
    PRUNED = "pruned"
    """Stopped early by the Optuna pruner."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    status: TrialStatus
    tokens_per_s: float | None = None
    """Global tokens/s over the measured steps (warm-up excluded)."""
    step_time_s: float | None = None
    """Median measured step time."""
    step_time_cov: float | None = None
    """Coefficient of variation of the measured step times."""
    peak_memory_bytes: float | None = None
    """Max over ranks of peak memory (GPU: max_memory_allocated; CPU: tracked)."""
    mfu: float | None = None
    loss: float | None = None
    error: str | None = None
    """One line: what went wrong (plus the stderr tail in ``stderr.log``)."""
    wall_s: float | None = None
    """Launch to exit, seconds."""
    extra: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status is TrialStatus.OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = str(self.status)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialResult:
        data = dict(data)
        data["status"] = TrialStatus(data["status"])
        return cls(**data)

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> TrialResult:
        return cls.from_dict(json.loads(path.read_text()))
