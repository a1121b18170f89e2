"""Kubernetes manifests, validated offline in strict mode (kubernetes-validate, no API server).

The static manifests under ``launchers/`` (the nightly ``autotune retune`` CronJob, ...) are core
Kubernetes kinds, so each document validates as it is. The emitted Kubeflow PyTorchJob is a CRD without a
schema there: ``tests/emit/test_emit_k8s.py`` validates each replica's pod template as a core/v1
``PodTemplate``; here the same for a plan over two nodes (a Master and a Worker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.catalog import make_cluster
from autotune.emit.launchers import pytorchjob_manifest
from autotune.plan import ParallelPlan

kv = pytest.importorskip("kubernetes_validate")

LAUNCHERS = Path(__file__).resolve().parents[2] / "launchers"
MANIFESTS = sorted(p for p in LAUNCHERS.glob("*.y*ml") if "apiVersion" in p.read_text())


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_launcher_manifests_are_valid_kubernetes(path):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kv.validate(doc, kv.latest_version(), strict=True)


def test_two_node_pytorchjob_pod_templates_are_valid_core_v1():
    cluster = make_cluster(num_gpus=16, gpu="h100-sxm")
    job = pytorchjob_manifest(ParallelPlan(tp=8, dp=2, global_batch=64, seq_len=4096), cluster)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {role: spec["replicas"] for role, spec in replicas.items()} == {"Master": 1, "Worker": 1}
    for role, spec in replicas.items():
        kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"trial-{role.lower()}"},
                     "template": spec["template"]}, kv.latest_version(), strict=True)
