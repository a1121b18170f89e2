"""Model and hardware catalogs: presets match their published shapes, user files fail with one clear line."""

import json

import pytest

from autotune.catalog import (
    gpu_names,
    load_gpu,
    load_link,
    load_model,
    make_cluster,
    model_names,
)
from autotune.clusterfile import load_cluster
from autotune.costmodel import estimate
from autotune.errors import ConfigError
from autotune.plan import Framework, ParallelPlan, Sharding


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("7b", 6.74),
        ("13b", 13.02),
        ("70b", 68.98),
        ("llama3-8b", 8.03),
        ("llama3-70b", 70.55),
        ("llama3-405b", 405.85),
        ("gpt3-175b", 174.6),
    ],
)
def test_preset_parameter_counts_match_published_sizes(name, billions):
    # Llama 2 paper Table 1 / HF model cards: 6.74B, 13.0B, 69.0B; Llama 3: 8.03B, 70.6B, 405.9B; GPT-3 175B.
    assert load_model(name).num_params / 1e9 == pytest.approx(billions, rel=2e-3)


def test_gqa_and_gelu_shapes():
    llama = load_model("70b")
    assert (llama.num_kv_heads, llama.kv_hidden_size, llama.num_mlp_matrices) == (8, 1024, 3)
    gpt = load_model("gpt3-175b")
    assert (gpt.num_mlp_matrices, gpt.tie_embeddings, gpt.learned_positions) == (2, True, True)


def test_hf_config_json_is_read(tmp_path):
    cfg = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = load_model(str(path))
    assert model.num_params / 1e9 == pytest.approx(7.24, rel=5e-3)  # Mistral-7B: 7.24B


def test_gpt2_style_keys(tmp_path):
    path = tmp_path / "gpt2.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_embd": 768,
                "n_layer": 12,
                "n_head": 12,
                "vocab_size": 50257,
                "n_positions": 1024,
                "activation_function": "gelu_new",
            }
        )
    )
    assert load_model(str(path)).num_params / 1e6 == pytest.approx(124.4, rel=5e-3)  # GPT-2 small: 124M


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "missing key 'hidden_size'"),
        (
            '{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3, "vocab_size": 10}',
            "not divisible",
        ),
        (
            '{"hidden_size": "big", "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10}',
            "'hidden_size' must be a positive integer",
        ),
        ("[1, 2]", "expected a mapping"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_model_file_names_the_key(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_model(str(path))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="known presets: 13b, 70b"):
        load_model("71b")
    with pytest.raises(ConfigError, match="h100-sxm"):
        load_gpu("h101")
    with pytest.raises(ConfigError, match="1gbe"):
        load_link("carrier-pigeon")


def test_catalog_covers_required_gpus():
    required = {
        "a100-40gb",
        "a100-80gb",
        "h100-sxm",
        "h100-pcie",
        "h200",
        "b200",
        "b300",
        "gb300",
        "l40s",
        "a10g",
        "rtx-4090",
        "mi300x",
        "cpu",
    }
    assert required <= set(gpu_names())
    for name in required:
        gpu = load_gpu(name)
        assert gpu.memory_bytes > 0 and gpu.sources and 0 < gpu.gemm_efficiency <= 1
    assert set(model_names()) >= {
        "7b",
        "13b",
        "70b",
        "llama3-8b",
        "llama3-70b",
        "llama3-405b",
        "gpt3-175b",
        "tiny",
        "small",
    }


def test_cluster_nic_share_and_divisibility(tmp_path):
    cluster = make_cluster(num_gpus=16, gpu="a100-80gb")
    assert (cluster.num_nodes, cluster.gpus_per_node) == (2, 8)
    assert cluster.inter_node_bw_per_gpu_bytes_per_s == pytest.approx(25e9)  # 8x HDR 200 Gb/s per 8 GPUs
    with pytest.raises(ConfigError, match="not a multiple of --gpus-per-node 8"):
        make_cluster(num_gpus=12, gpu="a100-80gb", gpus_per_node=8)
    path = tmp_path / "c.yaml"
    path.write_text(
        "gpu: h100-sxm\nnum_nodes: 4\ngpus_per_node: 8\ninter_node_link: 1gbe\nnics_per_node: 1\n"
    )
    slow = load_cluster(path)
    assert slow.num_gpus == 32 and slow.inter_link.key == "eth-1g"
    path.write_text("gpu: h100-sxm\nnum_nodes: 4\ngpus_per_node: 8\nnic: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'nic'"):
        load_cluster(path)


def test_another_network_brings_its_usual_port_count():
    assert make_cluster(num_gpus=16, inter_node="1gbe").nics_per_node == 1  # one Ethernet port per node
    assert make_cluster(num_gpus=16).nics_per_node == 8  # DGX H100: one 400G NIC per GPU
    assert make_cluster(num_gpus=16, inter_node="1gbe", nics_per_node=4).nics_per_node == 4


def test_cluster_yaml_may_declare_an_nvlink_domain_across_nodes(tmp_path):
    """A cluster file sets ``nvlink_domain_gpus`` (e.g. a DGX H100 SuperPOD with an NVLink Switch System); a
    GB200 takes its NVL72 domain from the catalog."""
    path = tmp_path / "c.yaml"
    path.write_text("gpu: h100-sxm\nnum_nodes: 4\ngpus_per_node: 8\nnvlink_domain_gpus: 32\n")
    assert load_cluster(path).nvlink_domain == 32
    path.write_text("gpu: gb200\nnum_nodes: 18\ngpus_per_node: 4\n")
    assert load_cluster(path).nvlink_domain == 72
    path.write_text("gpu: h100-sxm\nnum_nodes: 2\ngpus_per_node: 8\nnvlink_domain_gpus: 12\n")
    with pytest.raises(ConfigError, match="nvlink_domain_gpus"):
        load_cluster(path)


def test_the_h800_is_an_h100_with_its_nvlink_cut():
    """DeepSeek's GPU: every compute and memory figure and curve of h100-sxm (YAML merge), NVLink at 200
    GB/s per direction instead of 450."""
    import dataclasses

    h100, h800 = load_gpu("h100-sxm"), load_gpu("h800")
    differ = {f.name for f in dataclasses.fields(h100) if getattr(h100, f.name) != getattr(h800, f.name)}
    assert differ == {"key", "name", "intra_node_link", "sources"}
    assert make_cluster(num_gpus=16, gpu="h800").intra_link.bw_bytes_per_s == 200e9


@pytest.mark.parametrize(("nvl", "sxm"), [("h100-nvl", "h100-sxm"), ("h200-nvl", "h200")])
def test_an_nvl_card_is_its_sxm_twin_at_its_own_datasheet_peaks_over_pcie(nvl, sxm):
    """The PCIe NVL cards share their SXM twin's die: the same measured curves, as fractions of their own
    (lower-clocked) datasheet peaks, and PCIe between cards; so the same plan runs slower on them."""
    a, b = load_gpu(nvl), load_gpu(sxm)
    assert a.bf16_flops == pytest.approx(0.845 * b.bf16_flops, rel=1e-3)
    assert a.fp8_flops == pytest.approx(2 * a.bf16_flops, rel=1e-3)  # 3,341 and 1,671 TF sparse
    assert (a.gemm_shape_curve, a.attention_curves, a.gemm_efficiency) == (
        b.gemm_shape_curve,
        b.attention_curves,
        b.gemm_efficiency,
    )
    assert a.intra_node_link == "pcie5" and a.sources != b.sources
    model = load_model("llama3-8b")
    plan = ParallelPlan(
        dp=8,
        micro_batch=1,
        global_batch=16,
        seq_len=4096,
        framework=Framework.MEGATRON,
        sharding=Sharding.ZERO1,
    )
    slow, fast = (estimate(model, make_cluster(gpu=g, num_gpus=8), plan) for g in (nvl, sxm))
    assert slow.feasible and slow.tokens_per_s < fast.tokens_per_s


def test_every_gh100_card_carries_the_measured_gh100_curves():
    """The GEMM-shape, fp8 and attention curves were measured on a GH100 (H200); a Hopper card without them
    priced every GEMM and attention call at the large-shape efficiency: the Grand Teton H100 (500 W, 2.4 TB/s)
    ran a small-shape plan 2.7x faster than an H100 SXM."""
    gh100 = [load_gpu(n) for n in gpu_names() if load_gpu(n).compute_capability == 9.0]
    curves = load_gpu("h100-sxm")
    assert len(gh100) >= 7
    for gpu in gh100:
        assert (gpu.gemm_shape_curve, gpu.attention_curves, gpu.fp8_gemm_scale) == (
            curves.gemm_shape_curve,
            curves.attention_curves,
            curves.fp8_gemm_scale,
        ), gpu.key
    model = load_model("mistral-small-24b")
    plan = ParallelPlan(tp=2, pp=2, dp=8, cp=8, global_batch=256, seq_len=2048, framework=Framework.MEGATRON)
    capped, full = (
        estimate(model, make_cluster(gpu=g, num_gpus=256), plan) for g in ("h100-96gb", "h100-sxm")
    )
    assert load_gpu("h100-96gb").power_limit_w == 500
    assert capped.step_time_s > full.step_time_s
