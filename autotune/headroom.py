"""Memory headroom: the share of device memory the search keeps free when it recommends a plan.

The cost model's predicted peak (``Estimate.memory_bytes_per_gpu``, allocator reserve included) decides
whether a plan fits the device at all (``Estimate.feasible``). The search asks more of the plan it
recommends: at most ``(1 - headroom)`` of the device, so that a longer sample, allocator fragmentation
above the modelled mean or the model's own error does not turn the recommendation into an OOM. Why the
default is 10 %: docs/memory_headroom.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.costmodel.estimate import Estimate

__all__ = [
    "DEFAULT_MEMORY_HEADROOM",
    "MAX_MEMORY_HEADROOM",
    "headroom_budget_bytes",
    "headroom_reason",
    "peak_headroom_reason",
    "headroom_excess_bytes",
    "room_left",
]

DEFAULT_MEMORY_HEADROOM = 0.10
"""Share of device memory left free by a recommended plan (docs/memory_headroom.md)."""
MAX_MEMORY_HEADROOM = 0.9

_GIB = 1024**3


def headroom_budget_bytes(est: Estimate, headroom: float) -> float:
    """Bytes per GPU a recommended plan may use."""
    return (1.0 - headroom) * est.memory_capacity_bytes


def headroom_excess_bytes(est: Estimate, headroom: float) -> float:
    """Predicted peak minus the headroom budget (<= 0: within it)."""
    return est.memory_bytes_per_gpu - headroom_budget_bytes(est, headroom)


def headroom_reason(est: Estimate, headroom: float) -> str | None:
    """Why a plan that fits the device is not recommended; None within the headroom."""
    return peak_headroom_reason(est.memory_bytes_per_gpu, est.memory_capacity_bytes, headroom)


def peak_headroom_reason(peak_bytes: float, capacity_bytes: float, headroom: float) -> str | None:
    """``headroom_reason`` from a predicted peak and the device's capacity (before any step time)."""
    if peak_bytes - (1.0 - headroom) * capacity_bytes <= 0:
        return None
    return (
        f"above the memory headroom: needs {peak_bytes / _GIB:.1f} GiB per GPU, "
        f"more than {1 - headroom:.0%} of {capacity_bytes / _GIB:.1f} GiB "
        f"(--memory-headroom {headroom:g})"
    )


def room_left(est: Estimate) -> str:
    """'12.3 GiB (15%) of 79.6 GiB free': what the plan leaves of the device."""
    free = est.memory_capacity_bytes - est.memory_bytes_per_gpu
    return (
        f"{free / _GIB:.1f} GiB ({free / est.memory_capacity_bytes:.0%}) of "
        f"{est.memory_capacity_bytes / _GIB:.1f} GiB free"
    )
