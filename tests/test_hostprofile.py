"""The CPU trial device's host time is a measured profile (data/cpu_device.yaml), not GPU catalog fields."""

import dataclasses
import json
from importlib import resources

import pytest
import yaml

from autotune.catalog import gpu_names, load_gpu, load_model, make_cluster
from autotune.costmodel import estimate
from autotune.hostprofile import NO_HOST_TIME, host_keys, host_profile, load_host_profile
from autotune.plan import ParallelPlan
from autotune.scaleout import cluster_from_dict, spec_dict


def test_only_the_cpu_device_has_host_time():
    cpu = load_gpu("cpu").host
    assert cpu == load_host_profile("cpu_device.yaml") != NO_HOST_TIME
    assert cpu.op_overhead_s == 4e-6 and cpu.fsdp_host_bytes_per_s == 1.866e9
    assert cpu.pipeline_action_s("1f1b") == 276e-6 and cpu.pipeline_action_s("zbv") is None
    assert all(load_gpu(name).host == NO_HOST_TIME for name in gpu_names() if name != "cpu")


def test_a_profile_names_the_figures_it_replaces():
    cpu = load_gpu("cpu").host
    faster = host_profile({"op_overhead_us": 2, "pipeline_action_us": {"gpipe": 100}}, base=cpu)
    assert faster.op_overhead_s == 2e-6 and faster.pipeline_action_s("gpipe") == pytest.approx(1e-4)
    assert faster.pipeline_action_s("1f1b") is None and faster.zero3_host_module_s == cpu.zero3_host_module_s
    back = host_profile(host_keys(cpu))  # what a calibration writes reads back
    scalars = [f.name for f in dataclasses.fields(cpu) if f.name != "pipeline_action_overhead_s"]
    assert [getattr(back, n) for n in scalars] == pytest.approx([getattr(cpu, n) for n in scalars])
    assert dict(back.pipeline_action_overhead_s) == pytest.approx(dict(cpu.pipeline_action_overhead_s))
    assert host_keys(NO_HOST_TIME) == {}


def test_a_study_setup_written_with_flat_gpu_host_fields_still_loads():
    cluster = make_cluster(num_gpus=2, gpu="cpu")
    data = json.loads(json.dumps(spec_dict(cluster)))  # as the study stores it
    old = dict(data)
    old["gpu"] = {k: v for k, v in data["gpu"].items() if k != "host"} | data["gpu"]["host"]
    assert "op_overhead_s" in old["gpu"] and "host" not in old["gpu"]
    assert cluster_from_dict(data).gpu.host == cluster_from_dict(old).gpu.host == cluster.gpu.host
    plan = ParallelPlan(tp=1, pp=2, dp=1, micro_batch=1, global_batch=4, seq_len=64)
    expected = estimate(load_model("tiny"), cluster, plan).step_time_s
    assert estimate(load_model("tiny"), cluster_from_dict(old), plan).step_time_s == expected


def test_the_data_file_lists_every_figure():
    data = yaml.safe_load((resources.files("autotune.data") / "cpu_device.yaml").read_text())
    assert set(host_keys(load_gpu("cpu").host)) | {"sources"} == set(data)
    assert {f.name for f in dataclasses.fields(NO_HOST_TIME)} >= {"op_overhead_s", "zero3_host_bytes_per_s"}
