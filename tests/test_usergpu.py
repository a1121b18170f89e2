"""A GPU the user describes: inline in a cluster YAML or --gpu-spec FILE, with one-line errors."""

import pytest

from autotune.catalog import load_gpu
from autotune.clusterfile import load_cluster
from autotune.costmodel import kernels
from autotune.errors import ConfigError
from autotune.usergpu import gpu_from_mapping, load_gpu_spec


def test_a_base_gpu_with_what_differs():
    gpu = gpu_from_mapping(
        {"base": "h100-sxm", "memory_gib": 96, "memory_bandwidth_gb_s": 2400, "power_limit_w": 500}, where="t"
    )
    h100 = load_gpu("h100-sxm")
    assert gpu.memory_bytes == 96 * 1024**3 and gpu.memory_bandwidth_bytes_per_s == 2.4e12
    assert gpu.bf16_flops == h100.bf16_flops and gpu.gemm_shape_curve == h100.gemm_shape_curve
    assert kernels.clock_factor(gpu) < 1.0


def test_a_gpu_may_state_its_host_link():
    """A GH200-like card: NVLink-C2C to its CPU instead of PCIe (what activation offload copies over)."""
    gpu = gpu_from_mapping({"base": "h100-96gb", "host_link_gb_s": 450}, where="t")
    assert gpu.host_link_bytes_per_s == 450e9 and load_gpu("h100-96gb").host_link_bytes_per_s is None
    with pytest.raises(ConfigError, match="host_link_gb_s"):
        gpu_from_mapping({"base": "h100-sxm", "host_link_gb_s": 0}, where="t")


def test_a_new_gpu_carries_nothing_measured_from_elsewhere(tmp_path):
    path = tmp_path / "h20.yaml"
    path.write_text(
        "name: H20\nmemory_gib: 96\nmemory_bandwidth_gb_s: 4000\nbf16_tflops: 148\n"
        "fp8_tflops: 296\nkey: h20\n"
    )
    gpu = load_gpu_spec(path)
    assert gpu.key == "h20" and gpu.fp8_flops == 296e12 and gpu.fp16_flops == 148e12
    assert gpu.gemm_shape_curve == () and gpu.attention_curves == () and gpu.gemm_efficiency == 0.6


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"base": "h100-sxm", "memory_gb": 96}, "unknown gpu key 'memory_gb'"),
        ({"\n": 0}, r"unknown gpu key '\\n'"),  # found by tests/test_fuzz_inputs.py: the key is shown escaped
        ({1: 2, "x": 3}, "unknown gpu key 1"),  # keys of mixed types still sort
        ({"base": "h100-sxm", "bf16_tflops": -1}, "'bf16_tflops' must be a positive number"),
        ({"base": "h999"}, "'base' must be a catalog GPU"),
        ({"name": "x", "memory_gib": 80, "memory_bandwidth_gb_s": 2000}, "gpu needs key 'bf16_tflops'"),
        ({"base": "h100-sxm", "gemm_efficiency": 70}, "fraction of the peak"),
        (
            {
                "name": "x",
                "memory_gib": 80,
                "memory_bandwidth_gb_s": 2000,
                "bf16_tflops": 100,
                "power_limit_w": 300,
            },
            "'power_limit_w' needs 'tdp_w'",
        ),
        ({"base": "h100-sxm", "intra_node_link": "warp"}, "must be a link name"),
    ],
)
def test_mistakes_are_one_line_errors_naming_the_key(cfg, message):
    with pytest.raises(ConfigError, match=message) as err:
        gpu_from_mapping(cfg, where="cluster.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("cluster.yaml")


def test_a_cluster_yaml_may_define_its_gpu_inline(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "num_nodes: 2\ngpus_per_node: 8\ngpu:\n  base: h100-sxm\n  memory_gib: 96\n  power_limit_w: 500\n"
    )
    cluster = load_cluster(path)
    assert cluster.num_gpus == 16 and cluster.gpu.memory_bytes == 96 * 1024**3
    assert cluster.gpu.power_limit_w == 500 and cluster.intra_link.key == "nvlink4"
