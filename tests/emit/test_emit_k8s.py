"""pytorchjob.yaml. kubernetes-validate has no schema for the PyTorchJob CRD (it can only say so), so each
replica's pod template is validated in strict mode as what it is, a core/v1 ``PodTemplateSpec`` (wrapped in
a ``PodTemplate``). The CRD fields are checked against the rules of the Kubeflow training operator's
admission webhook (``pkg/webhooks/pytorch/pytorchjob_webhook.go``): a DNS-1035 name, only Master/Worker
replicas, exactly one Master, a container named ``pytorch`` with an image; ``nprocPerNode`` is a string
(``*string`` in the v1 API)."""

from __future__ import annotations

import re

import pytest
import yaml
from emit_cases import CASES

kv = pytest.importorskip("kubernetes_validate")

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _job(emitted, name: str) -> dict:
    return yaml.safe_load((emitted(name) / "pytorchjob.yaml").read_text())


@pytest.mark.parametrize("name", ["zero0", "hsdp", "megatron_interleaved"])  # 1, 4 and 8 nodes
def test_pod_templates_are_valid_core_v1(name, emitted):
    job = _job(emitted, name)
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        pod_template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}"},
            "template": spec["template"],
        }
        kv.validate(pod_template, kv.latest_version(), strict=True)


def test_strict_validation_catches_a_typo(emitted):
    job = _job(emitted, "zero0")
    template = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    template["spec"]["containers"][0]["resource"] = template["spec"]["containers"][0].pop("resources")
    with pytest.raises(kv.ValidationError):
        wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}, "template": template}
        kv.validate(wrapped, kv.latest_version(), strict=True)


def test_kubernetes_validate_has_no_schema_for_the_crd(emitted):
    with pytest.raises(kv.SchemaNotFoundError):
        kv.validate(_job(emitted, "zero0"), kv.latest_version(), strict=True)


@pytest.mark.parametrize("name", list(CASES))
def test_pytorchjob_satisfies_the_operator_webhook(name, emitted):
    _, _, cluster = CASES[name].build()
    job = _job(emitted, name)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert _DNS_1035.match(job["metadata"]["name"]) and len(job["metadata"]["name"]) <= 63
    assert job["spec"]["nprocPerNode"] == str(cluster.gpus_per_node)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert set(replicas) <= {"Master", "Worker"} and replicas["Master"]["replicas"] == 1
    assert sum(r["replicas"] for r in replicas.values()) == cluster.num_nodes
    for spec in replicas.values():
        (container,) = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "pytorch"]
        assert container["image"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == cluster.gpus_per_node
        assert container["command"][:2] == ["/bin/sh", "-c"] and container["args"] == []
        assert '. "$RUN_DIR/autotune_env.sh"' in container["command"][2]
    volume = replicas["Master"]["template"]["spec"]["volumes"][0]["configMap"]
    assert (
        _DNS_1035.match(volume["name"])
        and f"create configmap {volume['name']}" in (emitted(name) / "pytorchjob.yaml").read_text()
    )
    for item in volume["items"]:  # every file the pods need, at its place in the emitted folder
        assert (emitted(name) / item["path"]).is_file() and item["key"] == item["path"].rsplit("/")[-1]
