"""``emit_all``: write every artefact that can express the plan into one directory.

All files are rendered in memory first, so a plan an emitter rejects leaves nothing half-written. Each file is
then written atomically (temporary file in the same directory, fsync, ``os.replace``). Existing files are
never overwritten without ``force``; with ``force``, a file left over from an earlier emit that this plan
cannot express is removed so the directory never mixes two plans.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune.contract import SCRIPT_CONFIGS
from autotune.emit import launchers
from autotune.emit.deepspeed import deepspeed_unsupported, to_ds_config
from autotune.emit.fsdp import accelerate_unsupported, to_accelerate_config
from autotune.emit.megatron import megatron_args_text, megatron_entry, megatron_unsupported
from autotune.emit.megatronmodel import megatron_model_unsupported
from autotune.emit.planfile import plan_document
from autotune.emit.summary import primary_file, render_summary
from autotune.emit.torchrun import torchrun_args_text, trainer_unsupported
from autotune.emit.torchtitan import (
    dumps_toml,
    to_torchtitan_config,
    torchtitan_model_unsupported,
    torchtitan_unsupported,
)
from autotune.errors import ConfigError
from autotune.plan import ParallelPlan, check_plan
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["emit_all", "ARTEFACT_FILES", "own_file_unsupported", "remove_emitted"]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Context:
    plan: ParallelPlan
    model: ModelSpec
    cluster: ClusterSpec
    estimate: dict[str, Any] | None
    out_dir: Path
    measured: list[dict[str, Any]] | None = None
    image: str = launchers.K8S_IMAGE


@dataclass(frozen=True, kw_only=True, slots=True)
class _Artefact:
    name: str
    what: str
    render: Callable[[_Context], str]
    unsupported: Callable[[ParallelPlan], list[str]] = lambda plan: []
    model_unsupported: Callable[[ModelSpec, ParallelPlan], list[str]] = lambda model, plan: []
    """Why the framework cannot build the model itself, or run it as the plan says; [] when it can."""
    executable: bool = False


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def _yaml(header: str, data: dict[str, Any]) -> str:
    text: str = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return f"# {header}\n{text}"


def _contract_configs(plan: ParallelPlan) -> dict[str, str]:
    """Contract field -> emitted config, for the configs this plan gets (the names trials use too)."""
    emitted = {
        "ds_config": not deepspeed_unsupported(plan),
        "accelerate_config": not accelerate_unsupported(plan),
    }
    return {key: name for key, name in SCRIPT_CONFIGS.items() if emitted[key]}


def _pod_files(plan: ParallelPlan) -> list[str]:
    """What the PyTorchJob's ConfigMap holds: the contract, the worker's plan and model, the configs."""
    trial = [] if trainer_unsupported(plan) else ["trial/plan.json", "trial/trial.json"]
    return [
        *trial,
        launchers.CONTRACT_ENV_FILE,
        *_contract_configs(plan).values(),
    ]


_ARTEFACTS = (
    _Artefact(
        name="plan.json",
        what="the plan with its model, cluster and estimate; "
        "`autotune emit --plan plan.json --out DIR` re-emits everything from it",
        render=lambda c: _json(plan_document(c.plan, c.model, c.cluster, c.estimate)),
    ),
    _Artefact(
        name="trial/plan.json",
        what="the plan alone, as autotune's trial worker reads it",
        render=lambda c: _json(c.plan.to_dict()),
        unsupported=trainer_unsupported,
    ),
    _Artefact(
        name="trial/trial.json",
        what="the model, for autotune's trial worker (`--trial-dir trial`)",
        render=lambda c: _json({"model": dataclasses.asdict(c.model)}),
        unsupported=trainer_unsupported,
    ),
    _Artefact(
        name="ds_config.json",
        what="DeepSpeed config (`deepspeed.initialize(config=...)`)",
        render=lambda c: _json(to_ds_config(c.plan, c.model)),
        unsupported=deepspeed_unsupported,
    ),
    _Artefact(
        name="accelerate_fsdp.yaml",
        what="accelerate FSDP2 config (`accelerate launch --config_file`)",
        render=lambda c: _yaml(
            f"accelerate FSDP2 config: {launchers.plan_line(c.plan)}",
            to_accelerate_config(c.plan, c.model, c.cluster),
        ),
        unsupported=accelerate_unsupported,
    ),
    _Artefact(
        name="torchrun_args.txt",
        what="torchrun flags and autotune's trainer entry point (add `--rdzv_endpoint HOST:PORT`)",
        render=lambda c: torchrun_args_text(c.plan, c.cluster),
        unsupported=trainer_unsupported,
    ),
    _Artefact(
        name="torchtitan.toml",
        what="torchtitan job-config keys (merge into a job config)",
        render=lambda c: dumps_toml(
            to_torchtitan_config(c.plan, c.model),
            header=f"torchtitan keys for: {launchers.plan_line(c.plan)}",
        ),
        unsupported=torchtitan_unsupported,
        model_unsupported=torchtitan_model_unsupported,
    ),
    _Artefact(
        name="megatron_args.txt",
        what="Megatron-LM `{entry}` flags, one per line",
        render=lambda c: megatron_args_text(c.plan, c.model),
        unsupported=megatron_unsupported,
        model_unsupported=lambda model, plan: megatron_model_unsupported(model),
    ),
    _Artefact(
        name=launchers.CONTRACT_ENV_FILE,
        what="the plan and its configs for your script (AUTOTUNE_* "
        "variables, see Launch); every launcher here sources it",
        render=lambda c: launchers.contract_env(c.plan, _contract_configs(c.plan), c.cluster.gpu),
    ),
    _Artefact(
        name="launch_torchrun.sh",
        what="torchrun launcher: `bash launch_torchrun.sh train.py` on every node, MASTER_ADDR set",
        render=lambda c: launchers.torchrun_script(c.plan, c.cluster),
        executable=True,
    ),
    _Artefact(
        name="launch_deepspeed.sh",
        what="deepspeed launcher: `bash launch_deepspeed.sh train.py`",
        render=lambda c: launchers.deepspeed_script(c.plan, c.cluster),
        unsupported=deepspeed_unsupported,
        executable=True,
    ),
    _Artefact(
        name="launch_slurm.sbatch",
        what="Slurm batch script: `sbatch launch_slurm.sbatch train.py`",
        render=lambda c: launchers.slurm_script(c.plan, c.cluster),
        executable=True,
    ),
    _Artefact(
        name="pytorchjob.yaml",
        what="Kubeflow PyTorchJob (see its header for the ConfigMap and image)",
        render=lambda c: launchers.pytorchjob_yaml(
            c.plan, c.cluster, image=c.image, files=_pod_files(c.plan)
        ),
    ),
)
SUMMARY = "summary.md"
ARTEFACT_FILES: tuple[str, ...] = (*(a.name for a in _ARTEFACTS), SUMMARY)
"""Every file ``emit_all`` owns in an output directory."""


def own_file_unsupported(plan: ParallelPlan, model: ModelSpec) -> tuple[str, list[str]]:
    """The file that runs ``plan`` on the framework it was priced for (``summary.primary_file``) and why
    autotune cannot write it for ``model`` ([]: it can). A search whose best plan's file is missing also
    writes the best plan whose file is not."""
    name = primary_file(plan)
    art = next(a for a in _ARTEFACTS if a.name == name)
    return name, art.unsupported(plan) + art.model_unsupported(model, plan)


def remove_emitted(out_dir: Path) -> None:
    """Delete what ``emit_all`` wrote in ``out_dir`` (its own files only), and the folders left empty."""
    for name in ARTEFACT_FILES:
        (out_dir / name).unlink(missing_ok=True)
    for folder in (out_dir / "trial", out_dir):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _estimate_dict(estimate: Any) -> dict[str, Any] | None:
    if estimate is None or isinstance(estimate, Mapping):
        return dict(estimate) if estimate is not None else None
    return estimate.to_dict()  # type: ignore[no-any-return]


def _render_all(ctx: _Context) -> tuple[dict[str, tuple[str, bool]], list[tuple[str, list[str]]]]:
    contents: dict[str, tuple[str, bool]] = {}
    skipped: list[tuple[str, list[str]]] = []
    for art in _ARTEFACTS:
        reasons = art.unsupported(ctx.plan) + art.model_unsupported(ctx.model, ctx.plan)
        if reasons:
            skipped.append((art.name, reasons))
        else:
            contents[art.name] = (art.render(ctx), art.executable)
    entry = megatron_entry(ctx.model)  # the Megatron-LM script that builds the model
    written = [(a.name, a.what.format(entry=entry)) for a in _ARTEFACTS if a.name in contents]
    summary = render_summary(
        plan=ctx.plan,
        model=ctx.model,
        cluster=ctx.cluster,
        estimate=ctx.estimate,
        written=written,
        skipped=skipped,
        measured=ctx.measured,
    )
    contents[SUMMARY] = (summary, False)
    return contents, skipped


def _write_atomic(path: Path, text: str, *, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755 if executable else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prepare_dir(out_dir: Path, *, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir}: exists and is not a directory")
    if not force:
        existing = [name for name in ARTEFACT_FILES if (out_dir / name).exists()]
        if existing:
            raise ConfigError(
                f"{out_dir / existing[0]} already exists; pass --force to overwrite "
                f"({len(existing)} autotune file(s) in {out_dir})"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: cannot create ({e.strerror})") from None


def emit_all(
    plan: ParallelPlan,
    model: ModelSpec,
    cluster: ClusterSpec,
    estimate: Any,
    out_dir: str | Path,
    *,
    force: bool = False,
    measured: list[dict[str, Any]] | None = None,
    image: str | None = None,
) -> list[Path]:
    """Write every artefact that can express ``plan`` (and ``summary.md``) into ``out_dir``.

    ``estimate`` is an ``Estimate``, its ``to_dict()`` mapping, or None. Returns the written paths in
    artefact order. ``measured``: the search's best trials (``autotune search`` rows: plan, measured and
    predicted tokens/s and memory), shown beside the estimate in ``summary.md``. ``image``: the PyTorchJob's
    container image (default ``launchers.K8S_IMAGE``). Raises ``ConfigError``
    for a plan illegal on this model/cluster or an existing file
    without ``force``.
    """
    illegal = check_plan(plan, model, cluster)
    if illegal:
        raise ConfigError(illegal[0])
    out = Path(out_dir).resolve()
    ctx = _Context(
        plan=plan,
        model=model,
        cluster=cluster,
        estimate=_estimate_dict(estimate),
        out_dir=out,
        measured=measured,
        image=image or launchers.K8S_IMAGE,
    )
    contents, skipped = _render_all(ctx)
    _prepare_dir(out, force=force)
    paths: list[Path] = []
    for name, (text, executable) in contents.items():
        _write_atomic(out / name, text, executable=executable)
        paths.append(out / name)
    for name, _ in skipped:  # only reachable with force: a stale file from an earlier plan
        (out / name).unlink(missing_ok=True)
    return paths
