"""Nightly re-tuning: the history of a study's best plan, and the verdict on tonight's measurements.

``autotune retune`` (``cli/retune.py``) re-measures the incumbent and the top-K, runs a few new trials, and
appends one record to ``runs/<study>/history.jsonl``::

    {"date": "...Z", "study", "backend", "environment": {gpu_name, gpu_count, driver, cuda, nccl, torch,
     deepspeed, python, autotune, hostname, knobs: {ENV: value}}, "best": Measurement, "incumbent":
     Measurement | null, "remeasured": [Measurement], "new_trials", "verdict", "change", "noise_band",
     "threshold", "cause", "message"}

Noise: a measurement's noise is the robust CoV of its measured step times, ``1.4826 * MAD / median`` (one
slow step under load does not inflate it); the median of ``n`` steps has a relative standard error of about
``1.2533 * noise / sqrt(n)``, which is also the standard error of its logarithm. Ratios are judged on the
log scale (a slowdown cannot pass -100 %, a speed-up has no bound): two measurements differ beyond their
noise when ``|ln(b / a)|`` exceeds ``noise_band = 2 * sqrt(se_a**2 + se_b**2)``.

Verdict against the last record: **regression** when the last best plan, measured again now, is slower
beyond its noise by more than the threshold, ``ln(now / then) < ln(1 - threshold) - noise_band`` (or it
fails); the suspected cause is the environment drift between the two records, named key by key.
**improvement** when another plan beats tonight's measurement of the last best plan with
``ln(best / incumbent) > ln(1 + threshold) + noise_band``. Otherwise **stable** (**baseline** on the first
run).
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError
from autotune.plan import ParallelPlan
from autotune.render import plan_summary
from autotune.trials.result import TrialResult

__all__ = [
    "Measurement",
    "Verdict",
    "environment",
    "measurement",
    "compare",
    "environment_drift",
    "plan_diff",
    "read_history",
    "append_history",
    "record_of",
    "promote",
    "parse_budget",
    "KNOB_ENV",
]

KNOB_ENV = (
    "AUTOTUNE_SLOWDOWN_MS",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_IB_DISABLE",
    "NCCL_P2P_DISABLE",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_SOCKET_IFNAME",
)
"""Environment variables that change a step's speed: recorded, and named when they drift."""
_MEDIAN_SE = 1.2533  # sqrt(pi/2): standard error of a normal sample's median / that of its mean


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """One plan measured (or predicted, on ``simulate``) tonight."""

    plan: dict[str, Any]
    summary: str
    status: str
    tokens_per_s: float | None
    predicted_tokens_per_s: float | None
    noise_cov: float
    """Robust CoV of the measured step times (0 for predictions)."""
    num_steps: int
    trial: int | None = None
    """The study trial that holds it."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.tokens_per_s)

    @property
    def rel_se(self) -> float:
        return _MEDIAN_SE * self.noise_cov / math.sqrt(max(self.num_steps, 1))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    kind: str
    """baseline | stable | regression | improvement"""
    change: float | None
    """Relative change of the last best plan (now / then - 1), or of the new best over it (improvement)."""
    noise_band: float
    cause: str | None
    message: str


def measurement(
    plan: ParallelPlan, result: TrialResult, predicted: float | None, trial: int | None = None
) -> Measurement:
    noise, steps = _noise(result)
    return Measurement(
        plan=plan.to_dict(),
        summary=plan_summary(plan),
        status=str(result.status),
        tokens_per_s=result.tokens_per_s,
        predicted_tokens_per_s=predicted,
        noise_cov=noise,
        num_steps=steps,
        trial=trial,
        error=_first_line(result.error),
    )


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0][:300] if text and text.strip() else None


def _noise(result: TrialResult) -> tuple[float, int]:
    extra = result.extra or {}
    times = extra.get("step_times_s")
    if extra.get("simulated") or not times:
        return (float(result.step_time_cov or 0.0), 1)
    measured = times[int(extra.get("warmup_steps", 0)) :] or times
    median = statistics.median(measured)
    mad = statistics.median(abs(t - median) for t in measured)
    return (1.4826 * mad / median if median > 0 else 0.0, len(measured))


# ---------------------------------------------------------------------------------------------- environment
def environment() -> dict[str, Any]:
    """What tonight runs on: accelerator, driver, CUDA/NCCL, library versions, host, speed knobs."""
    from autotune.preflight import local_gpu_count

    env: dict[str, Any] = {
        "gpu_name": None,
        "gpu_count": local_gpu_count(),
        "driver": _driver(),
        "cuda": None,
        "nccl": None,
        "torch": _version("torch"),
        "deepspeed": _version("deepspeed"),
        "python": platform.python_version(),
        "autotune": _version("autotune"),
        "hostname": socket.gethostname(),
        "knobs": {k: os.environ[k] for k in KNOB_ENV if k in os.environ},
    }
    if env["gpu_count"]:
        import torch

        env.update(gpu_name=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
        except (RuntimeError, AttributeError):  # a build without NCCL (ROCm has RCCL under the same API)
            pass
    else:
        env["gpu_name"] = f"none (CPU: {_cpu_name()}, {os.cpu_count()} cores)"
    return env


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        text = ""
    match = re.search(r"Kernel Module\s+(\S+)", text)
    if match:
        return match.group(1)
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        return out.splitlines()[0].strip() if out.strip() else None
    return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment_drift(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``"torch 2.12.0 -> 2.13.0"`` for every key (and speed knob) that changed."""

    def flat(env: dict[str, Any]) -> dict[str, Any]:
        knobs = env.get("knobs", {})
        return {**{k: v for k, v in env.items() if k != "knobs"}, **{k: knobs.get(k) for k in KNOB_ENV}}

    before, after = flat(old), flat(new)
    return [
        f"{k} {_shown(before.get(k))} -> {_shown(after.get(k))}"
        for k in after
        if before.get(k) != after.get(k)
    ]


def _shown(value: Any) -> str:
    return "unset" if value is None else str(value)


# ---------------------------------------------------------------------------------------------- verdict
def compare(
    last: dict[str, Any] | None,
    incumbent: Measurement | None,
    best: Measurement,
    env: dict[str, Any],
    threshold: float,
) -> Verdict:
    """Tonight against the last record (see the module docstring for the rule)."""
    if last is None:
        return Verdict(
            kind="baseline",
            change=None,
            noise_band=0.0,
            cause=None,
            message=f"first record: {best.summary} at {best.tokens_per_s:,.0f} tokens/s",
        )
    then = Measurement.from_dict(last["best"])
    if incumbent is None or not incumbent.ok:
        why = incumbent.error or incumbent.status if incumbent else "not measured"
        return Verdict(
            kind="regression",
            change=None,
            noise_band=0.0,
            cause=_cause(last, env),
            message=f"{then.summary} now fails ({why}); it ran at {then.tokens_per_s:,.0f} tokens/s",
        )
    band = 2 * math.hypot(then.rel_se, incumbent.rel_se)
    change = incumbent.tokens_per_s / then.tokens_per_s - 1  # type: ignore[operator]
    was = (
        f"{then.summary}: {then.tokens_per_s:,.0f} -> {incumbent.tokens_per_s:,.0f} tokens/s "
        f"({change:+.1%}; noise band ±{band:.1%}, threshold {threshold:.0%})"
    )
    if math.log1p(change) < math.log1p(-threshold) - band:
        return Verdict(
            kind="regression",
            change=change,
            noise_band=band,
            cause=_cause(last, env),
            message=f"slower beyond noise: {was}",
        )
    if best.plan != incumbent.plan and best.ok:
        band_new = 2 * math.hypot(best.rel_se, incumbent.rel_se)
        gain = best.tokens_per_s / incumbent.tokens_per_s - 1  # type: ignore[operator]
        if math.log1p(gain) > math.log1p(threshold) + band_new:
            return Verdict(
                kind="improvement",
                change=gain,
                noise_band=band_new,
                cause=None,
                message=f"{best.summary} runs {gain:+.1%} faster than {incumbent.summary} "
                f"({best.tokens_per_s:,.0f} vs {incumbent.tokens_per_s:,.0f} tokens/s; "
                f"noise band ±{band_new:.1%})",
            )
    return Verdict(kind="stable", change=change, noise_band=band, cause=None, message=was)


def _cause(last: dict[str, Any], env: dict[str, Any]) -> str:
    drift = environment_drift(last.get("environment", {}), env)
    if drift:
        return "environment drift: " + ", ".join(drift)
    return (
        "no recorded environment change: suspect the hardware (clocks, thermals, a degraded link or "
        "GPU), other jobs on the nodes, or the network/filesystem"
    )


def plan_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``"tp: 2 -> 4"`` for every plan field that changed."""
    return [f"{k}: {old.get(k)} -> {new.get(k)}" for k in new if old.get(k) != new.get(k)]


# ---------------------------------------------------------------------------------------------- files
def read_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{i}: not a JSON record ({e.msg}); fix or move the file") from None
    return records


def append_history(path: Path, record: dict[str, Any]) -> None:
    """One line, appended and fsync'ed (a crash leaves whole records)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def record_of(**fields: Any) -> dict[str, Any]:
    """A history record: measurements as dicts."""
    return {
        k: (
            asdict(v)
            if isinstance(v, Measurement)
            else [asdict(m) for m in v]
            if isinstance(v, list) and v and isinstance(v[0], Measurement)
            else v
        )
        for k, v in fields.items()
    }


def promote(best_dir: Path, plan: ParallelPlan, model: Any, cluster: Any, estimate: Any) -> list[Path]:
    """New launch files in ``best/``; the previous ones move to ``best.prev/`` (replacing older ones)."""
    from autotune.emit import emit_all

    prev = best_dir.with_name(best_dir.name + ".prev")
    if best_dir.exists():
        if prev.exists():
            shutil.rmtree(prev)
        best_dir.rename(prev)
    return emit_all(plan, model, cluster, estimate, best_dir, force=True)


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``"8"`` -> 8 new trials; ``"30m"``, ``"90s"``, ``"2h"`` -> a wall-clock budget in seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or (not match.group(2) and "." in match.group(1)):
        raise ConfigError(f"--budget {text!r}: expected a trial count (8) or a duration (90s, 30m, 2h)")
    value, unit = float(match.group(1)), match.group(2)
    if not unit:
        return int(value), None
    return None, value * {"s": 1, "m": 60, "h": 3600}[unit]
