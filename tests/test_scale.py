"""`autotune scale` reproduces known shapes as numbers: 7B data parallelism collapses over 1 GbE between nodes
and holds over InfiniBand; 70B needs the GPUs whose memory holds its training states."""

import io
import json
import re

import matplotlib.image
import pytest

from autotune.catalog import load_model, make_cluster
from autotune.cli import main
from autotune.errors import ConfigError
from autotune.scale import parse_tokens, scale
from autotune.space import load_space

_GB = 1e9


def _scale(model, counts, *, global_batch=1024, pins=None, **link):
    return scale(
        load_model(model),
        counts,
        lambda n: make_cluster(num_gpus=n, **link),
        space=load_space(),
        global_batch=global_batch,
        seq_len=4096,
        pins=pins,
        tokens=1e12,
        price_per_gpu_hour=2.0,
    )


@pytest.mark.slow
def test_7b_over_infiniband_holds_with_the_users_global_batch_at_every_count_and_time_and_cost_follow():
    result = _scale("7b", [8, 16], inter_node="ib-200")
    assert result.points[1].efficiency > 0.7 and result.first_below is None
    for p in result.points:
        assert p.best.plan.global_batch == 1024
        assert p.train_time_s == pytest.approx(1e12 / p.best.tokens_per_s)
        assert p.cost_dollars == pytest.approx(p.train_time_s / 3600 * p.num_gpus * 2.0)


@pytest.mark.slow
def test_70b_needs_the_gpus_whose_memory_holds_its_states():
    model = load_model("70b")
    assert model.num_params * 16 > 8 * 80 * _GB  # bf16 weights+grads, fp32 master + Adam: 16 B/param > 1.1 TB
    result = _scale("70b", [8, 16, 32])
    assert result.smallest_fit is not None and result.smallest_fit >= 16
    eight = result.points[0]
    assert eight.num_gpus == 8 and eight.status == "does not fit"
    assert re.match(r"out of (host )?memory", eight.detail)  # GPU memory, or host memory with offload


def test_counts_the_batch_cannot_be_divided_for_are_reported_as_such():
    result = _scale("7b", [4, 8], global_batch=12, pins={"tp": 1, "pp": 1, "cp": 1})  # DP = the GPUs
    assert [p.status for p in result.points] == ["ok", "batch"]
    assert "global batch 12 cannot be divided over 8 GPUs" in result.points[1].detail


def test_parse_tokens():
    assert parse_tokens("1T") == 1e12 and parse_tokens("300B") == 3e11 and parse_tokens("2.5e12") == 2.5e12
    for bad in ("lots", "-1T", "0"):
        with pytest.raises(ConfigError):
            parse_tokens(bad)


@pytest.mark.slow
def test_7b_over_1gbe_collapses_across_nodes_and_says_why_in_json_and_plot(tmp_path, capsys):
    """One 1 GbE port per node: data parallelism across two nodes collapses, and the CLI says why."""
    plot = tmp_path / "scale.png"
    code = main(
        [
            "scale",
            "--model",
            "7b",
            "--gpus",
            "8,16",
            "--inter-node",
            "1gbe",
            "--nics-per-node",
            "1",
            "--tokens",
            "1T",
            "--price-per-gpu-hour",
            "2",
            "--json",
            "--plot",
            str(plot),
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["smallest_fit"] == 8 and out["first_below"] == 16
    assert "exposed DP comm grows" in out["why"] and "now crosses nodes over 1x eth-1g" in out["why"]
    one_node, two_nodes = out["points"]
    assert (one_node["num_gpus"], two_nodes["num_gpus"]) == (8, 16)
    assert one_node["efficiency"] == pytest.approx(1.0) and two_nodes["efficiency"] < 0.3
    assert matplotlib.image.imread(io.BytesIO(plot.read_bytes()), format="png").shape[1] > 1000


@pytest.mark.slow
def test_cli_text_names_the_smallest_fit_and_where_efficiency_falls(capsys):
    assert main(["scale", "--model", "70b", "--gpus", "8,16"]) == 0
    out = capsys.readouterr().out
    assert "does not fit: out of" in out and "smallest count that fits: 16 GPUs" in out


def test_cli_bad_input_is_one_line_exit_2(capsys):
    assert main(["scale", "--model", "7b", "--inter-node", "carrier-pigeon"]) == 2
    err = capsys.readouterr().err
    assert "unknown link 'carrier-pigeon'" in err and len(err.strip().splitlines()) == 1
