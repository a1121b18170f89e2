"""Launch scripts and manifests rendered from the templates in ``autotune/emit/templates/``.

The templates ship as package data (the one source of truth, so a non-editable install finds them) and use
``{{name}}`` placeholders: shell ``$VARS`` pass through untouched, and a placeholder without a value is an
error rather than an empty string. Every value that reaches a shell line is ``shlex.quote``d here.
"""

from __future__ import annotations

import copy
import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune import __version__
from autotune.contract import ENV
from autotune.emit.command import ShellRef, shell_join, torchrun_command, worker_entry
from autotune.emit.megatron import megatron_env
from autotune.emit.torchrun import rdzv_id
from autotune.plan import Framework, ParallelPlan
from autotune.specs import ClusterSpec, GPUSpec

__all__ = [
    "render",
    "plan_line",
    "contract_env",
    "torchrun_script",
    "deepspeed_script",
    "slurm_script",
    "pytorchjob_manifest",
    "pytorchjob_yaml",
    "CONTRACT_ENV_FILE",
    "K8S_CONFIG_DIR",
    "K8S_RUN_DIR",
    "K8S_IMAGE",
]

CONTRACT_ENV_FILE = "autotune_env.sh"
"""The one file every launcher sources: the contract's variables for the user's script."""
K8S_CONFIG_DIR = "/workspace/config"
"""Where each pod mounts the ConfigMap, laid out as the emitted folder (read-only)."""
K8S_RUN_DIR = "/workspace/run"
"""Each pod's writable RUN_DIR (an emptyDir the ConfigMap's files are copied into)."""
K8S_IMAGE = "autotune:latest"
"""Default image (``autotune emit --image`` sets another); it must hold torch, autotune and the script."""

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render(template: str, values: dict[str, str]) -> str:
    """Fill ``{{name}}`` placeholders of ``templates/<template>``; every placeholder needs a value."""
    text = resources.files("autotune.emit").joinpath("templates").joinpath(template).read_text()
    missing = set(_PLACEHOLDER.findall(text)) - set(values)
    if missing:
        raise KeyError(f"{template}: no value for {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def plan_line(plan: ParallelPlan) -> str:
    """One comment-safe line naming the plan's knobs."""
    p = plan
    return (
        f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} micro_batch={p.micro_batch} "
        f"global_batch={p.global_batch} seq_len={p.seq_len} sharding={p.sharding} "
        f"recompute={p.recompute} precision={p.precision} framework={p.framework}"
    )


def _common(plan: ParallelPlan, cluster: ClusterSpec | None) -> dict[str, str]:
    nodes = {"num_nodes": str(cluster.num_nodes)} if cluster else {}
    return {"plan_line": plan_line(plan), "version": __version__, **nodes}


_ENV_WHY = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "Megatron validate_args (TP/CP > 1: 1; the EP overlap: 32)",
    "UB_SKIPMC": "TE comm+GEMM overlap without CUDA multicast (compute capability < 9.0)",
}


def contract_env(plan: ParallelPlan, configs: dict[str, str], gpu: GPUSpec | None = None) -> str:
    """``autotune_env.sh``: ``configs`` maps a contract field (``ds_config``, ...) to its emitted file;
    plans priced for Megatron also get ``megatron_env`` (for ``gpu``), overridable from the caller's
    environment."""
    config_lines = "".join(f'export {ENV[key]}="$RUN_DIR/{name}"\n' for key, name in configs.items())
    extra = megatron_env(plan, gpu) if plan.framework is Framework.MEGATRON else {}
    env_lines = "".join(
        f'export {k}="${{{k}:-{shlex.quote(v)}}}"  # {_ENV_WHY.get(k, "Megatron")}\n'
        for k, v in extra.items()
    )
    return (
        render(
            "autotune_env.sh.tmpl",
            {**_common(plan, None), "config_lines": config_lines, "env_lines": env_lines},
        ).rstrip("\n")
        + "\n"
    )


_WORKER_ENTRY = shell_join(worker_entry(ShellRef(f"${ENV['trial_dir']}")))
"""Without a user script, autotune's trainer on the contract's trial directory."""


def _torchrun_line(cluster: ClusterSpec, rdzv: str, entry: list[str]) -> str:
    """The script's torchrun line: the trial runner's ``torchrun_command`` with shell words in it."""
    return shell_join(
        torchrun_command(
            nnodes=cluster.num_nodes,
            nproc_per_node=cluster.gpus_per_node,
            rdzv_endpoint=ShellRef("$MASTER_ADDR:$MASTER_PORT"),
            rdzv_id=ShellRef(rdzv),
            entry=entry,
        )
    )


def torchrun_script(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    return render(
        "torchrun.sh.tmpl",
        {
            **_common(plan, cluster),
            "default_master_addr": "localhost" if cluster.num_nodes == 1 else "",
            "rdzv_id": shlex.quote(rdzv_id(plan, cluster)),
            "worker_entry": _WORKER_ENTRY,
            "torchrun_command": _torchrun_line(cluster, "$RDZV_ID", [ShellRef("${ENTRY[@]}")]),
        },
    )


_HOSTFILE_NOTE = """
# Multi-node: HOSTFILE (default: RUN_DIR/hostfile) lists each node as 'hostname slots=GPUS';
# the deepspeed launcher reaches the nodes over passwordless ssh (pdsh)."""
_HOSTFILE_LINES = """HOSTFILE="${HOSTFILE:-$RUN_DIR/hostfile}"
[ -f "$HOSTFILE" ] || { echo "missing $HOSTFILE: one 'hostname slots=GPUS' line per node" >&2; exit 2; }
MASTER_ADDR="${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"
# pdsh passes the remote ranks only the variables listed in DS_ENV_FILE (the runner pastes each into an
# `export K=V;`, hence shell-quoted values): the contract's among them
export DS_ENV_FILE="${DS_ENV_FILE:-$(mktemp "${TMPDIR:-/tmp}/autotune_ds_env.XXXXXX")}"
for name in ${!AUTOTUNE_@} CUDA_DEVICE_MAX_CONNECTIONS; do
  if [ -n "${!name+set}" ]; then printf '%s=%q\\n' "$name" "${!name}"; fi
done > "$DS_ENV_FILE"
"""


def deepspeed_script(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    multi = cluster.num_nodes > 1
    fixed = ["--num_nodes", str(cluster.num_nodes), "--num_gpus", str(cluster.gpus_per_node)]
    return render(
        "deepspeed.sh.tmpl",
        {
            **_common(plan, cluster),
            "hostfile_note": _HOSTFILE_NOTE if multi else "",
            "hostfile_lines": _HOSTFILE_LINES if multi else "",
            "deepspeed_args": shlex.join(fixed),
            "multinode_args": (
                ' --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"'
                if multi
                else ""
            ),
        },
    )


def slurm_script(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    """No path of the planning machine: the job finds its folder through ``scontrol`` (or ``RUN_DIR``)."""
    return render(
        "slurm.sbatch.tmpl",
        {
            **_common(plan, cluster),
            "job_name": rdzv_id(plan, cluster),
            "gpus_per_node": str(cluster.gpus_per_node),
            "worker_entry": _WORKER_ENTRY,
            "torchrun_command": _torchrun_line(cluster, "$SLURM_JOB_ID", [ShellRef("${ENTRY[@]}")]),
        },
    )


_POD_SCRIPT = "; ".join(
    [
        "set -e",
        f'CONFIG_DIR="${{AUTOTUNE_CONFIG_DIR:-{K8S_CONFIG_DIR}}}"',
        f'export RUN_DIR="${{RUN_DIR:-{K8S_RUN_DIR}}}"',
        'cp -RL "$CONFIG_DIR"/* "$RUN_DIR"/',
        f'. "$RUN_DIR/{CONTRACT_ENV_FILE}"',
        f'if [ "$#" -eq 0 ]; then set -- {_WORKER_ENTRY}; fi',
        'exec torchrun "$@"',
    ]
)
"""The pod's shell: copy the read-only ConfigMap into the writable RUN_DIR, source the contract, then start
torchrun (nodes, processes per node, node rank and master address from the operator's PET_* variables) on
the container's ``args`` (autotune's trainer when empty)."""


def configmap_items(files: list[str]) -> list[dict[str, str]]:
    """ConfigMap key (a file's name) -> its path under the mount, so the pod sees the emitted layout."""
    return [{"key": Path(f).name, "path": f} for f in files]


def _pod_template(cluster: ClusterSpec, configmap: str, image: str, files: list[str]) -> dict[str, Any]:
    container = {
        "name": "pytorch",  # the operator requires one container of this name
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _POD_SCRIPT, "autotune"],  # "autotune" is $0; args follow as $@
        "args": [],
        "resources": {"limits": {"nvidia.com/gpu": cluster.gpus_per_node}},
        "volumeMounts": [
            {"name": "config", "mountPath": K8S_CONFIG_DIR, "readOnly": True},
            {"name": "run", "mountPath": K8S_RUN_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    volumes = [
        {"name": "config", "configMap": {"name": configmap, "items": configmap_items(files)}},
        {"name": "run", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]  # NCCL and dataloaders need a big /dev/shm
    return {
        "metadata": {"labels": {"app.kubernetes.io/created-by": "autotune"}},
        "spec": {"containers": [container], "volumes": volumes},
    }


def pytorchjob_manifest(
    plan: ParallelPlan, cluster: ClusterSpec, *, image: str = K8S_IMAGE, files: list[str]
) -> dict[str, Any]:
    """A Kubeflow ``kubeflow.org/v1`` PyTorchJob: one Master pod plus ``num_nodes - 1`` Worker pods;
    ``files``: the emitted files the pods need (paths relative to the emitted folder, distinct names)."""
    name = rdzv_id(plan, cluster)
    template = _pod_template(cluster, f"{name}-config", image, files)
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if cluster.num_nodes > 1:
        replicas["Worker"] = {
            "replicas": cluster.num_nodes - 1,
            "restartPolicy": "OnFailure",
            "template": copy.deepcopy(template),
        }  # no YAML anchors in the output
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "autotune"}},
        "spec": {"nprocPerNode": str(cluster.gpus_per_node), "pytorchReplicaSpecs": replicas},
    }


def pytorchjob_yaml(
    plan: ParallelPlan, cluster: ClusterSpec, *, image: str = K8S_IMAGE, files: list[str]
) -> str:
    manifest = pytorchjob_manifest(plan, cluster, image=image, files=files)
    return render(
        "pytorchjob.yaml.tmpl",
        {
            **_common(plan, cluster),
            "configmap": f"{manifest['metadata']['name']}-config",
            "configmap_files": " ".join(f"--from-file={shlex.quote(f)}" for f in files),
            "image": image,
            "config_dir": K8S_CONFIG_DIR,
            "run_dir": K8S_RUN_DIR,
            "num_workers": str(cluster.num_nodes - 1),
            "manifest": yaml.safe_dump(
                manifest, sort_keys=False, default_flow_style=False, width=1000
            ).rstrip("\n"),
        },
    )
