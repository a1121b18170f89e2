"""Host time a device does not hide: ``HostProfile``, measured on the CPU trial device and empty on GPUs.

A CPU rank runs its operators, DTensor bookkeeping, pipeline-schedule actions and FSDP2 / ZeRO-3 hooks on
the host itself, so each costs step time (``costmodel.hostops``, ``costmodel.pipeline``); a GPU launches
kernels asynchronously and hides them, so its profile is all 0. The figures are data: a catalog GPU names its
file (``host_profile: cpu_device.yaml`` in ``data/hardware.yaml``), and a probe profile or a calibration
(``--profile``) carries the same keys (``*_us``, ``*_gb_s``) for a machine's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

__all__ = ["HostProfile", "NO_HOST_TIME", "HOST_KEYS", "host_profile", "host_keys", "load_host_profile"]


@dataclass(frozen=True, kw_only=True, slots=True)
class HostProfile:
    op_overhead_s: float = 0.0
    """Host seconds per eager operator (Python, dispatcher, autograd), charged per operator the trial model
    runs (``costmodel.hostops``); ``autotune probe`` (``probe.overhead``) measures it."""
    dtensor_op_overhead_s: float = 0.0
    """Host seconds per operator on a DTensor (sharding propagation, redistribution planning, the local
    operator and the re-wrap), charged per DTensor operator that torch-native TP runs."""
    dtensor_collective_overhead_s: float = 0.0
    """Host seconds a TP collective issued by a DTensor redistribution costs beyond the direct collective
    (functional collectives, the wait, the re-wrap); the collective itself is ``comm``'s. One figure for
    every kind (the median of the three the probe times), because the kinds' own figures did not reproduce
    from probe to probe (benchmarks/results/calibration_summary.md)."""
    pipeline_action_overhead_s: tuple[tuple[str, float], ...] = ()
    """Host seconds per action (a forward or backward of one micro-batch on one stage) of each torch pipeline
    schedule, with its sends and receives (``probe.pipeline``); where listed it replaces the link latency of
    each activation send (``costmodel.pipeline``)."""
    fsdp_host_unit_s: float = 0.0
    """FSDP2's host seconds per wrapped unit per micro-batch (unshard / reshard hooks, the gradient copy-in,
    divide and copy-out around each reduction; benchmarks/fsdp_host.py)."""
    fsdp_host_bytes_per_s: float = 0.0
    """The rate at which FSDP2's host copies go through the rank's parameter bytes per micro-batch."""
    zero3_host_module_s: float = 0.0
    """DeepSpeed ZeRO-3's host seconds per parameter-holding module per micro-batch (its fetch / release
    hooks; benchmarks/zero3_host.py)."""
    zero3_host_bytes_per_s: float = 0.0
    """The rate at which ZeRO-3's host work goes through the rank's parameter bytes per micro-batch."""

    def pipeline_action_s(self, schedule: str) -> float | None:
        """Measured host seconds per action of a torch pipeline ``schedule``; None where not measured."""
        return dict(self.pipeline_action_overhead_s).get(schedule)

    def scaled(self, scale: float) -> HostProfile:
        """Host times x ``scale`` and host rates / ``scale``: a host running ``1 / scale`` as fast."""
        return HostProfile(
            op_overhead_s=self.op_overhead_s * scale,
            dtensor_op_overhead_s=self.dtensor_op_overhead_s * scale,
            dtensor_collective_overhead_s=self.dtensor_collective_overhead_s * scale,
            pipeline_action_overhead_s=tuple((k, v * scale) for k, v in self.pipeline_action_overhead_s),
            fsdp_host_unit_s=self.fsdp_host_unit_s * scale,
            fsdp_host_bytes_per_s=self.fsdp_host_bytes_per_s / scale,
            zero3_host_module_s=self.zero3_host_module_s * scale,
            zero3_host_bytes_per_s=self.zero3_host_bytes_per_s / scale,
        )


NO_HOST_TIME = HostProfile()
"""A GPU's: the device hides its host time."""

_SCALAR_KEYS = {
    "op_overhead_us": ("op_overhead_s", 1e-6),
    "dtensor_op_overhead_us": ("dtensor_op_overhead_s", 1e-6),
    "dtensor_collective_overhead_us": ("dtensor_collective_overhead_s", 1e-6),
    "fsdp_host_unit_us": ("fsdp_host_unit_s", 1e-6),
    "fsdp_host_gb_s": ("fsdp_host_bytes_per_s", 1e9),
    "zero3_host_module_us": ("zero3_host_module_s", 1e-6),
    "zero3_host_gb_s": ("zero3_host_bytes_per_s", 1e9),
}
"""Data key -> (field, unit in SI)."""
_PER_OPERATOR = frozenset({"op_overhead_us", "dtensor_op_overhead_us", "dtensor_collective_overhead_us"})
"""Written as seconds x 1e6 (the rest as seconds / unit), as profiles always were (byte for byte)."""
HOST_KEYS = frozenset({*_SCALAR_KEYS, "pipeline_action_us"})
"""The keys of a host profile in data files and probe profiles."""


def host_profile(data: Mapping[str, Any], base: HostProfile = NO_HOST_TIME) -> HostProfile:
    """``base`` with the figures ``data`` lists (data-file units: ``*_us``, ``*_gb_s``)."""
    fields: dict[str, Any] = {
        field: float(data[key]) * unit if key in data else getattr(base, field)
        for key, (field, unit) in _SCALAR_KEYS.items()
    }
    fields["pipeline_action_overhead_s"] = (
        tuple((s, float(us) * 1e-6) for s, us in data["pipeline_action_us"].items())
        if data.get("pipeline_action_us")
        else base.pipeline_action_overhead_s
    )
    return HostProfile(**fields)


def host_keys(host: HostProfile) -> dict[str, Any]:
    """The data keys that ``host_profile`` turns back into ``host`` (its non-zero figures)."""
    keys: dict[str, Any] = {
        key: getattr(host, field) * 1e6 if key in _PER_OPERATOR else getattr(host, field) / unit
        for key, (field, unit) in _SCALAR_KEYS.items()
    }
    keys = {k: v for k, v in keys.items() if v}
    if host.pipeline_action_overhead_s:
        keys["pipeline_action_us"] = {k: v * 1e6 for k, v in host.pipeline_action_overhead_s}
    return keys


def load_host_profile(name: str) -> HostProfile:
    """A host profile shipped in ``autotune/data`` (e.g. ``cpu_device.yaml``)."""
    data = yaml.safe_load(resources.files("autotune.data").joinpath(name).read_text())
    return host_profile(data)
