"""The analytic cost model: memory and step time of a plan, each term citing its source."""

from autotune.costmodel.estimate import Estimate, estimate, fit_check
from autotune.costmodel.memory import MemoryBreakdown, memory_breakdown
from autotune.costmodel.steptime import TimeBreakdown, step_time

__all__ = [
    "Estimate",
    "estimate",
    "fit_check",
    "MemoryBreakdown",
    "memory_breakdown",
    "TimeBreakdown",
    "step_time",
]
