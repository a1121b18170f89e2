"""Hardware profiles: what ``autotune probe`` measured, as overrides of the catalog (torch-free).

A profile is a YAML file (``runs/profiles/<name>.yaml``) that ``estimate`` and ``search`` take with
``--profile P``. It replaces, on the cluster it is applied to, only what was measured:

``gpu``              catalog key the measurement stands for (the cluster must use the same GPU type)
``gpu_overrides``    ``gemm_efficiency``; on a CPU also the peaks ``fp32_tflops`` / ``bf16_tflops`` (the
                     catalog has no datasheet for "a CPU": the best measured GEMM becomes the peak) and
                     ``memory_bandwidth_gb_s`` (measured copy bandwidth / ``steptime.HBM_EFFICIENCY``, so the
                     model's streaming rate is the measured one), ``op_overhead_us``, the host time per
                     eager operator, ``dtensor_op_overhead_us``, per DTensor operator, and
                     ``dtensor_collective_overhead_us``, per TP collective via DTensor (``probe.overhead``;
                     the median of the kinds, each kept under ``measurements``; profiles written before
                     2026-12-03 also list them as ``dtensor_collective_op_overhead_us``, read and not used:
                     ``HostProfile.dtensor_collective_overhead_s`` says why), and
                     ``pipeline_action_us``, per action of each torch pipeline schedule (``probe.pipeline``);
                     a calibration also writes the host profile's FSDP2 / ZeRO-3 terms (``fsdp_host_unit_us``,
                     ``fsdp_host_gb_s``, ``zero3_host_module_us``, ``zero3_host_gb_s``) x its host scale
``intra_node_link``  ``bw_gb_s``, ``latency_us``: alpha-beta fit of the in-node all-reduce (busbw)
``inter_node_link``  the same across nodes, per NIC (only when the probe ran on several nodes)
``intra_node_collectives``  ``all_gather``, ``reduce_scatter``: each one's own alpha-beta fit
                     (its ring's steps and bus-bandwidth factor), applied as multiples of the all-reduce's
                     (``ClusterSpec.collective_scales``)
``cluster``          ``collective_efficiency`` (1.0: the link numbers are already what collectives reach),
                     ``dp_overlap_fraction`` (measured by ``probe.overlap``, or fitted by a calibration),
                     on a CPU ``cores_per_node`` (the cores the probe's ranks could run on),
                     and from a calibration ``step_overhead_s``, ``microbatch_overhead_s`` and, on a CPU,
                     ``shared_core_latency``

A calibration (``runs/<study>/calibration.yaml``) has the same keys, so it is a valid ``--profile`` too:
``cluster_overrides`` writes every term of the calibrated cluster that the keys above carry.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import ConfigError
from autotune.hostprofile import host_keys, host_profile
from autotune.plan import Schedule
from autotune.specs import ClusterSpec, LinkSpec
from autotune.userfile import read_text

__all__ = [
    "Profile",
    "load_profile",
    "apply_profile",
    "with_profile",
    "cluster_overrides",
    "write_profile",
    "PER_OP",
    "PROFILE_DIR",
]

PROFILE_DIR = Path("runs") / "profiles"
_GPU_KEYS = {
    "fp32_tflops",
    "bf16_tflops",
    "fp16_tflops",
    "gemm_efficiency",
    "memory_bandwidth_gb_s",
    "op_overhead_us",
    "dtensor_op_overhead_us",
    "dtensor_collective_overhead_us",
    "dtensor_collective_op_overhead_us",
    "pipeline_action_us",
    "fsdp_host_unit_us",
    "fsdp_host_gb_s",
    "zero3_host_module_us",
    "zero3_host_gb_s",
}
_LINK_KEYS = {"bw_gb_s", "latency_us"}
_CLUSTER_KEYS = {
    "collective_efficiency",
    "dp_overlap_fraction",
    "step_overhead_s",
    "microbatch_overhead_s",
    "cores_per_node",
    "shared_core_latency",
}
_TOP_KEYS = {
    "name",
    "kind",
    "measured",
    "gpu",
    "gpu_overrides",
    "intra_node_link",
    "inter_node_link",
    "intra_node_collectives",
    "cluster",
    "source",
    "summary",
    "measurements",
    "fit",
    "trials",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    name: str
    kind: str
    """``probe`` or ``calibration``."""
    measured: str
    """When (``YYYY-MM-DD HH:MM:SS``)."""
    gpu: str
    gpu_overrides: dict[str, Any] = field(default_factory=dict)
    intra_node_link: dict[str, float] | None = None
    inter_node_link: dict[str, float] | None = None
    intra_node_collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    """``all_gather`` / ``reduce_scatter`` -> their own ``bw_gb_s``, ``latency_us`` fit (``PER_OP``)."""
    cluster: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """What an estimate header shows: ``profile: cpu-2rank (measured 2026-11-30)``."""
        kind = "profile" if self.kind == "probe" else self.kind
        return f"{kind}: {self.name} (measured {self.measured[:10]})"


_PER_KIND = {
    "dtensor_collective_op_overhead_us": {"all_gather", "reduce_scatter", "all_reduce"},
    "pipeline_action_us": {s.value for s in Schedule},
}
"""Keys whose value is a mapping of a kind (collective, pipeline schedule) -> number."""


_FRACTIONS = {"gemm_efficiency", "collective_efficiency", "dp_overlap_fraction", "shared_core_latency"}
PER_OP = ("all_gather", "reduce_scatter")
"""Collectives fitted on their own besides the all-reduce (``ClusterSpec.collective_scales``). Not send/recv:
the pipeline's transfers (``torch.distributed.pipelining``: batched isend/irecv driven by the schedule's
actions) cost more than the bare send/recv the probe times -- 0.6-0.75 ms each on the 2-rank landscape
(interleaved minus 1F1B step time per extra transfer) against 0.17 ms for a bare 64 KiB send/recv -- so they
keep the all-reduce link's alpha-beta until the probe times a schedule's transfers."""


def _numbers(data: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of {', '.join(sorted(allowed))}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            raise ConfigError(f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
        if key in _PER_KIND and isinstance(value, dict):
            out[key] = _numbers(value, _PER_KIND[key], f"{where}: {key}")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{where}: key {key!r} must be a number >= 0, got {value!r}")
        if key in _FRACTIONS and value > 1:
            raise ConfigError(f"{where}: key {key!r} is a fraction, between 0 and 1; got {value!r}")
        out[key] = float(value)
    return out


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile; every problem is one ``ConfigError`` line naming the key."""
    where = str(path)
    try:
        data = yaml.safe_load(read_text(path, "--profile", missing="run `autotune probe` first"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpu"), str):
        raise ConfigError(f"{where}: not a profile (needs a 'gpu' key naming the catalog GPU it measured)")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    links = {
        k: _numbers(data.get(k), _LINK_KEYS, f"{where}: {k}") or None
        for k in ("intra_node_link", "inter_node_link")
    }
    for key, link in links.items():
        if link is not None and not link.get("bw_gb_s"):
            raise ConfigError(f"{where}: {key} needs a positive 'bw_gb_s'")
    ops = data.get("intra_node_collectives") or {}
    if not isinstance(ops, dict) or set(ops) - set(PER_OP):
        raise ConfigError(
            f"{where}: intra_node_collectives: a mapping of {', '.join(PER_OP)} to their "
            "bw_gb_s and latency_us"
        )
    fits = {
        op: _numbers(fit, _LINK_KEYS, f"{where}: intra_node_collectives: {op}") for op, fit in ops.items()
    }
    if ops and not links["intra_node_link"]:
        raise ConfigError(f"{where}: intra_node_collectives needs intra_node_link (the all-reduce fit)")
    for op, fit in fits.items():
        if not fit.get("bw_gb_s"):
            raise ConfigError(f"{where}: intra_node_collectives: {op} needs a positive 'bw_gb_s'")
    return Profile(
        name=str(data.get("name", Path(path).stem)),
        kind=str(data.get("kind", "probe")),
        measured=str(data.get("measured", "unknown date")),
        gpu=data["gpu"],
        gpu_overrides=_numbers(data.get("gpu_overrides"), _GPU_KEYS, f"{where}: gpu_overrides"),
        intra_node_link=links["intra_node_link"],
        inter_node_link=links["inter_node_link"],
        intra_node_collectives=fits,
        cluster=_numbers(data.get("cluster"), _CLUSTER_KEYS, f"{where}: cluster"),
    )


def _ratio(value: float, base: float) -> float:
    """``value / base``, or 1 where either fit could not resolve the term (a sweep of small messages leaves
    the bandwidth infinite, one of large messages the latency 0)."""
    if not (0 < value < math.inf and 0 < base < math.inf):
        return 1.0
    return value / base


def _collective_scales(profile: Profile) -> tuple[tuple[str, float, float], ...]:
    """Each fitted collective's latency and bandwidth as multiples of the all-reduce fit."""
    base = profile.intra_node_link
    if not base or not profile.intra_node_collectives:
        return ()
    return tuple(
        (
            op,
            _ratio(fit.get("latency_us", 0.0), base.get("latency_us", 0.0)),
            _ratio(fit["bw_gb_s"], base["bw_gb_s"]),
        )
        for op, fit in sorted(profile.intra_node_collectives.items())
    )


def _link(base: LinkSpec, override: dict[str, float] | None, profile: Profile) -> LinkSpec:
    if override is None:
        return base
    latency_s = override.get("latency_us", base.latency_s * 1e6) * 1e-6
    # an NCCL link's ring hops move with its measured latency (as ``calibrate.fit.Factors.latency_scale``)
    hop_s = base.ring_hop_s
    if hop_s is not None and base.latency_s > 0:
        hop_s *= latency_s / base.latency_s
    return dataclasses.replace(
        base,
        bw_bytes_per_s=override["bw_gb_s"] * 1e9,
        latency_s=latency_s,
        ring_hop_s=hop_s,
        sources=(profile.label,),
    )


def apply_profile(cluster: ClusterSpec, profile: Profile) -> ClusterSpec:
    """The cluster with the profile's measured numbers in place of the catalog's (data, not globals)."""
    if profile.gpu != cluster.gpu.key:
        raise ConfigError(
            f"--profile {profile.name} was measured on {profile.gpu!r} but the cluster uses "
            f"{cluster.gpu.key!r}; pass --gpu {profile.gpu}"
        )
    g = profile.gpu_overrides
    gpu = dataclasses.replace(
        cluster.gpu,
        fp32_flops=g["fp32_tflops"] * 1e12 if "fp32_tflops" in g else cluster.gpu.fp32_flops,
        bf16_flops=g["bf16_tflops"] * 1e12 if "bf16_tflops" in g else cluster.gpu.bf16_flops,
        fp16_flops=g["fp16_tflops"] * 1e12 if "fp16_tflops" in g else cluster.gpu.fp16_flops,
        gemm_efficiency=g.get("gemm_efficiency", cluster.gpu.gemm_efficiency),
        memory_bandwidth_bytes_per_s=(
            g["memory_bandwidth_gb_s"] * 1e9
            if "memory_bandwidth_gb_s" in g
            else cluster.gpu.memory_bandwidth_bytes_per_s
        ),
        host=host_profile(g, base=cluster.gpu.host),
        sources=(*cluster.gpu.sources, profile.label),
    )
    label = profile.label if not cluster.profile else f"{cluster.profile}; {profile.label}"
    numbers: dict[str, Any] = dict(profile.cluster)
    if profile.intra_node_collectives:
        numbers["collective_scales"] = _collective_scales(profile)
    if "cores_per_node" in numbers:
        numbers["cores_per_node"] = max(1, round(numbers["cores_per_node"]))
    return dataclasses.replace(
        cluster,
        gpu=gpu,
        intra_link=_link(cluster.intra_link, profile.intra_node_link, profile),
        inter_link=_link(cluster.inter_link, profile.inter_node_link, profile),
        profile=label,
        **numbers,
    )


def with_profile(cluster: ClusterSpec, path: str | Path) -> ClusterSpec:
    """``cluster`` with the measured numbers of a probe profile or a study calibration (``--profile``)."""
    return apply_profile(cluster, load_profile(path))


def cluster_overrides(cluster: ClusterSpec) -> dict[str, Any]:
    """The profile keys that make ``apply_profile`` turn the catalog's cluster into ``cluster`` (the inverse
    of ``apply_profile`` for what a profile can carry): how a calibration is written as a ``--profile``."""
    gpu = cluster.gpu
    g: dict[str, Any] = {
        f"{p}_tflops": flops / 1e12 for p in ("fp32", "bf16", "fp16") if (flops := gpu.peak_flops(p))
    }
    g |= {
        "gemm_efficiency": gpu.gemm_efficiency,
        "memory_bandwidth_gb_s": gpu.memory_bandwidth_bytes_per_s / 1e9,
    }
    g |= host_keys(gpu.host)
    links = {
        k: {"bw_gb_s": lk.bw_bytes_per_s / 1e9, "latency_us": lk.latency_s * 1e6}
        for k, lk in (("intra_node_link", cluster.intra_link), ("inter_node_link", cluster.inter_link))
    }
    intra = links["intra_node_link"]
    ops = {
        op: {"bw_gb_s": intra["bw_gb_s"] * bw, "latency_us": intra["latency_us"] * lat}
        for op, lat, bw in cluster.collective_scales
    }
    numbers: dict[str, Any] = {
        "collective_efficiency": cluster.collective_efficiency,
        "step_overhead_s": cluster.step_overhead_s,
        "microbatch_overhead_s": cluster.microbatch_overhead_s,
    }
    if cluster.dp_overlap_fraction is not None:
        numbers["dp_overlap_fraction"] = cluster.dp_overlap_fraction
    if cluster.cores_per_node is not None:
        numbers["cores_per_node"] = cluster.cores_per_node
    if cluster.shared_core_latency:
        numbers["shared_core_latency"] = cluster.shared_core_latency
    return {
        "gpu": gpu.key,
        "gpu_overrides": g,
        **links,
        **({"intra_node_collectives": ops} if ops else {}),
        "cluster": numbers,
    }


def write_profile(data: dict[str, Any], path: Path) -> Path:
    """Write a profile mapping as YAML (creating the directory); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=110))
    return path
