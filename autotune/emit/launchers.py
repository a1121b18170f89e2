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
from autotune.emit.torchrun import TRIAL_DIR, WORKER_MODULE, rdzv_id
from autotune.plan import ParallelPlan
from autotune.specs import ClusterSpec
from autotune.trials.command import ShellRef, shell_join, torchrun_command, worker_entry

__all__ = ["render", "plan_line", "torchrun_script", "deepspeed_script", "slurm_script",
           "pytorchjob_manifest", "pytorchjob_yaml", "K8S_CONFIG_DIR", "K8S_TRIAL_DIR", "K8S_IMAGE"]

K8S_CONFIG_DIR = "/workspace/config"
"""Where each pod mounts the ConfigMap made from the emitted ``trial/`` folder (read-only)."""
K8S_TRIAL_DIR = "/workspace/trial"
"""The worker's writable trial directory in each pod (an emptyDir the files are copied into)."""
K8S_IMAGE = "autotune:latest"
"""Placeholder image; the manifest's header says to replace it."""

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render(template: str, values: dict[str, str]) -> str:
    """Fill ``{{name}}`` placeholders of ``templates/<template>``; every placeholder needs a value."""
    text = resources.files("autotune.emit").joinpath("templates", template).read_text()
    missing = set(_PLACEHOLDER.findall(text)) - set(values)
    if missing:
        raise KeyError(f"{template}: no value for {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def plan_line(plan: ParallelPlan) -> str:
    """One comment-safe line naming the plan's knobs."""
    p = plan
    return (f"tp={p.tp} pp={p.pp} dp={p.dp} cp={p.cp} micro_batch={p.micro_batch} "
            f"global_batch={p.global_batch} seq_len={p.seq_len} sharding={p.sharding} "
            f"recompute={p.recompute} precision={p.precision} framework={p.framework}")


def _common(plan: ParallelPlan, cluster: ClusterSpec) -> dict[str, str]:
    return {"plan_line": plan_line(plan), "version": __version__, "num_nodes": str(cluster.num_nodes)}


def _torchrun_line(cluster: ClusterSpec, rdzv: str, entry: list[str]) -> str:
    """The script's torchrun line: the trial runner's ``torchrun_command`` with shell words in it."""
    return shell_join(torchrun_command(nnodes=cluster.num_nodes, nproc_per_node=cluster.gpus_per_node,
                                       rdzv_endpoint=ShellRef("$MASTER_ADDR:$MASTER_PORT"),
                                       rdzv_id=ShellRef(rdzv), entry=entry))


def torchrun_script(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    return render("torchrun.sh.tmpl", {
        **_common(plan, cluster),
        "default_master_addr": "localhost" if cluster.num_nodes == 1 else "",
        "rdzv_id": shlex.quote(rdzv_id(plan, cluster)),
        "worker_entry": shell_join(worker_entry(ShellRef(f"$HERE/{TRIAL_DIR}"))),
        "torchrun_command": _torchrun_line(cluster, "$RDZV_ID", [ShellRef("${ENTRY[@]}")]),
    })


_HOSTFILE_NOTE = """
# Multi-node: HOSTFILE (default: ./hostfile beside this script) lists each node as 'hostname slots=GPUS';
# the deepspeed launcher reaches the nodes over passwordless ssh (pdsh)."""
_HOSTFILE_LINES = """HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
[ -f "$HOSTFILE" ] || { echo "missing $HOSTFILE: one 'hostname slots=GPUS' line per node" >&2; exit 2; }
MASTER_ADDR="${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"
"""


def deepspeed_script(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    multi = cluster.num_nodes > 1
    fixed = ["--num_nodes", str(cluster.num_nodes), "--num_gpus", str(cluster.gpus_per_node)]
    return render("deepspeed.sh.tmpl", {
        **_common(plan, cluster),
        "hostfile_note": _HOSTFILE_NOTE if multi else "",
        "hostfile_lines": _HOSTFILE_LINES if multi else "",
        "deepspeed_args": shlex.join(fixed),
        "multinode_args": (' --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"'
                           if multi else ""),
    })


def slurm_script(plan: ParallelPlan, cluster: ClusterSpec, run_dir: Path) -> str:
    """``run_dir`` is absolute: sbatch runs a spooled copy of the script, so it cannot find its own folder."""
    return render("slurm.sbatch.tmpl", {
        **_common(plan, cluster),
        "job_name": rdzv_id(plan, cluster),
        "gpus_per_node": str(cluster.gpus_per_node),
        "run_dir": shlex.quote(str(run_dir)),
        "torchrun_command": _torchrun_line(cluster, "$SLURM_JOB_ID",
                                           worker_entry(ShellRef(f"$RUN_DIR/{TRIAL_DIR}"))),
    })


def _pod_command() -> list[str]:
    """Copy the read-only ConfigMap files into the writable trial dir, then start torchrun, which takes
    nodes, processes per node, node rank and master address from the operator's PET_* variables."""
    torchrun = shlex.join(["torchrun", "-m", WORKER_MODULE, "--trial-dir", K8S_TRIAL_DIR])
    return ["/bin/sh", "-c", f"cp {K8S_CONFIG_DIR}/*.json {K8S_TRIAL_DIR}/ && exec {torchrun}"]


def _pod_template(cluster: ClusterSpec, configmap: str) -> dict[str, Any]:
    container = {
        "name": "pytorch",  # the operator requires one container of this name
        "image": K8S_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": _pod_command(),
        "resources": {"limits": {"nvidia.com/gpu": cluster.gpus_per_node}},
        "volumeMounts": [{"name": "config", "mountPath": K8S_CONFIG_DIR, "readOnly": True},
                         {"name": "trial", "mountPath": K8S_TRIAL_DIR},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    volumes = [{"name": "config", "configMap": {"name": configmap}},
               {"name": "trial", "emptyDir": {}},
               {"name": "dshm", "emptyDir": {"medium": "Memory"}}]  # NCCL and dataloaders need a big /dev/shm
    return {"metadata": {"labels": {"app.kubernetes.io/created-by": "autotune"}},
            "spec": {"containers": [container], "volumes": volumes}}


def pytorchjob_manifest(plan: ParallelPlan, cluster: ClusterSpec) -> dict[str, Any]:
    """A Kubeflow ``kubeflow.org/v1`` PyTorchJob: one Master pod plus ``num_nodes - 1`` Worker pods."""
    name = rdzv_id(plan, cluster)
    template = _pod_template(cluster, f"{name}-trial")
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if cluster.num_nodes > 1:
        replicas["Worker"] = {"replicas": cluster.num_nodes - 1, "restartPolicy": "OnFailure",
                              "template": copy.deepcopy(template)}  # no YAML anchors in the output
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "autotune"}},
        "spec": {"nprocPerNode": str(cluster.gpus_per_node), "pytorchReplicaSpecs": replicas},
    }


def pytorchjob_yaml(plan: ParallelPlan, cluster: ClusterSpec) -> str:
    manifest = pytorchjob_manifest(plan, cluster)
    return render("pytorchjob.yaml.tmpl", {
        **_common(plan, cluster),
        "configmap": f"{manifest['metadata']['name']}-trial",
        "trial_dir": TRIAL_DIR,
        "pod_trial_dir": K8S_TRIAL_DIR,
        "num_workers": str(cluster.num_nodes - 1),
        "manifest": yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False).rstrip("\n"),
    })
