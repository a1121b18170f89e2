"""``get_backend(name, ...)``: simulate | torchrun | deepspeed | auto.

``auto`` runs real trials when they can run here: this node has at least the cluster's GPUs per node
(``torch.cuda.device_count()``) and the cluster is this one node, or ``--device cpu`` asks for CPU trials on
gloo (all ranks as local processes). Otherwise it plans with the cost model and says so in one line, with
how to measure. A multi-node cluster is planned, not measured, unless an ``executor`` starts its nodes
(``slurm``: a job or an ``srun`` step per trial; ``multinode``: every agent here on loopback, for tests),
and then every ``auto`` trial is real. torch is imported only when a GPU driver is present, so planning
on a laptop stays fast.

``trial_options(workload=..., script=...)`` checks ``--workload`` / ``--script`` before anything launches and
gives the ``TrialConfig`` fields real backends pass to every trial; ``BackendChoice.pins`` are the knobs the
trials can run at one value only (the search pins them; a user's pin of another value is a ``ConfigError``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend
from autotune.backends.simulate import SimulateBackend
from autotune.errors import ConfigError
from autotune.plan import Framework
from autotune.preflight import local_gpu_count
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["BACKENDS", "BackendChoice", "get_backend", "trial_options", "apply_pins"]

BACKENDS = ("auto", "simulate", "torchrun", "deepspeed")
_REAL = {  # backend -> (module, class, frameworks it can run)
    "torchrun": ("autotune.backends.torchrun", "TorchrunBackend", frozenset({Framework.FSDP})),
    "deepspeed": ("autotune.backends.deepspeed", "DeepSpeedBackend", frozenset({Framework.DEEPSPEED})),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendChoice:
    backend: Backend
    frameworks: frozenset[Framework] | None
    """Frameworks it can run (None: any); the search leaves the others out of the space."""
    note: str | None = None
    """One line for the user, e.g. that results are predictions and how to measure."""
    pins: dict[str, Any] = field(default_factory=dict)
    """Knob -> the one value its trials can run, with why (``pin_reasons``)."""
    pin_reasons: dict[str, str] = field(default_factory=dict)


class _ByFramework:
    """Real trials: each plan goes to the backend of its framework."""

    measures = True

    def __init__(self, backends: dict[Framework, Backend]) -> None:
        self._backends = backends
        self.name = "+".join(b.name for b in backends.values())

    def preflight(self, cluster: ClusterSpec) -> None:
        """The FSDP backend's checks (torch, the devices): a missing DeepSpeed fails only its own plans."""
        first = self._backends.get(Framework.FSDP) or next(iter(self._backends.values()))
        first.preflight(cluster)  # type: ignore[attr-defined]

    def run(self, request, report=None):  # type: ignore[no-untyped-def]
        return self._backends[request.plan.framework].run(request, report)


def trial_options(*, workload: str | None = None, script: str | None = None) -> dict[str, Any]:
    """``TrialConfig`` fields for ``--workload MODULE:FUNC`` / ``--script FILE``, checked here (the builder
    imports, the script exists) so that a bad one is one line before any trial launches."""
    if workload and script:
        raise ConfigError("--workload and --script both replace autotune's trainer: pass one")
    if workload:
        from autotune.workload import import_root, load_builder

        load_builder(workload)
        return {"workload": workload, "workload_root": import_root(workload), "peak_flops_per_gpu": None}
    if script:
        path = Path(script).resolve()
        if not path.is_file():
            raise ConfigError(f"--script {script}: no such file")
        return {"script": str(path), "peak_flops_per_gpu": None}
    return {}


def _pins(options: Mapping[str, Any], model: ModelSpec | None) -> tuple[dict[str, Any], dict[str, str]]:
    if options.get("script"):  # the script decides what it can run
        return {}, {}
    if model is not None and model.is_moe and not options.get("workload"):  # trials/parallelize.py
        return {"cp": 1, "etp": 1, "tp": 1, "moe_dispatcher": "alltoall"}, {
            "cp": "context parallelism is not implemented in real trials",
            "etp": "expert tensor parallelism is not implemented in real trials",
            "tp": "MoE layers are not tensor-parallel in real trials (EP splits the experts)",
            "moe_dispatcher": "the trial MoE exchanges tokens all-to-all (no DeepEP kernels in trials)",
        }
    if options.get("workload"):
        why = "pipeline and context parallelism are not applied to a --workload model"
        experts = "expert parallelism is not applied to a --workload model"
        return {"pp": 1, "cp": 1, "ep": 1, "etp": 1}, {"pp": why, "cp": why, "ep": experts, "etp": experts}
    return {"cp": 1, "etp": 1}, {
        "cp": "context parallelism is not implemented in real trials",
        "etp": "expert tensor parallelism is not implemented in real trials",
    }


def apply_pins(pins: Mapping[str, Any], choice: BackendChoice) -> dict[str, Any]:
    """The user's pins plus the backend's; ``ConfigError`` where they disagree."""
    merged = dict(pins)
    for knob, value in choice.pins.items():
        if merged.get(knob) not in (None, value):
            raise ConfigError(
                f"--{knob.replace('_', '-')} {merged[knob]}: {choice.pin_reasons[knob]}; "
                f"drop it or pass --{knob.replace('_', '-')} {value}"
            )
        merged[knob] = value
    return merged


def get_backend(
    name: str,
    *,
    cluster: ClusterSpec,
    device: str | None = None,
    options: Mapping[str, Any] | None = None,
    executor: str = "local",
    model: ModelSpec | None = None,
) -> BackendChoice:
    """The backend for ``--backend NAME --device DEV`` on this node; ``options``: ``trial_options(...)``;
    ``model``: what the trials will train (an MoE model pins what its trials cannot split)."""
    options = dict(options or {})
    if name == "simulate":
        if options:
            raise ConfigError(
                "--workload/--script run in real trials: use --backend torchrun or deepspeed "
                "(with --device cpu where there are no GPUs)"
            )
        return BackendChoice(
            backend=SimulateBackend(),
            frameworks=None,
            note="simulate: tokens/s are the cost model's predictions",
        )
    pins, reasons = _pins(options, model)
    if name in _REAL:
        return BackendChoice(
            backend=_load(name, device, options, executor),
            frameworks=_REAL[name][2],
            pins=pins,
            pin_reasons=reasons,
        )
    if name != "auto":
        raise ConfigError(f"--backend: unknown backend '{name}'; known: {', '.join(BACKENDS)}")
    have = 0 if device == "cpu" else local_gpu_count()
    here = have >= cluster.gpus_per_node and cluster.num_nodes == 1
    if executor != "local" or device == "cpu" or here:
        backends = {
            fw: _load(n, device or "cuda", options, executor)
            for n, (_, _, fws) in _REAL.items()
            for fw in fws
        }
        return BackendChoice(
            backend=_ByFramework(backends), frameworks=frozenset(backends), pins=pins, pin_reasons=reasons
        )
    if options:
        raise ConfigError(
            "--workload/--script run in real trials, and this node cannot run them here: "
            "run on the GPU node, or pass --device cpu"
        )
    if device == "cuda":
        raise ConfigError(
            f"--device cuda: this node has {have} CUDA GPUs; the plan needs "
            f"{cluster.num_nodes} node(s) of {cluster.gpus_per_node}; drop --device to plan "
            "with the cost model"
        )
    if cluster.num_nodes == 1:
        why = (
            f"this node has {have} of the {cluster.gpus_per_node} GPUs; to measure, run the same command "
            "on the GPU node"
        )
    else:
        why = (
            f"the plan spans {cluster.num_nodes} nodes; measure on the cluster with --executor slurm, or "
            "run the best plan with its launch files in best/ (launch_slurm.sbatch, ...)"
        )
    return BackendChoice(
        backend=SimulateBackend(),
        frameworks=None,
        note=f"planning with the cost model (predictions, not measurements): {why}",
    )


def _load(name: str, device: str | None, options: Mapping[str, Any], executor: str = "local") -> Backend:
    module, cls, _ = _REAL[name]
    try:
        backend_cls = getattr(importlib.import_module(module), cls)
    except (ModuleNotFoundError, AttributeError):
        raise ConfigError(
            f"--backend {name}: {module}.{cls} is not available in this install; "
            "use --backend simulate to plan with the cost model"
        ) from None
    return backend_cls(device=device or "cuda", executor=executor, **options)  # type: ignore[no-any-return]
