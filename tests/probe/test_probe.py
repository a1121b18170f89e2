"""`autotune probe`: nccl-tests conventions, the alpha-beta fit, a real 2-rank gloo probe (< 60 s) and one
across two torchrun agents (two "nodes" on loopback)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from distributed import free_port

from autotune.catalog import make_cluster
from autotune.cli import main
from autotune.costmodel import comm
from autotune.costmodel.hostops import BLOCK_OPS
from autotune.errors import ConfigError
from autotune.probe.collectives import BUSBW_FACTOR, OPS, message_sizes
from autotune.probe.fit import fit_alpha_beta
from autotune.probe.pipeline import MICROBATCHES, SCHEDULES
from autotune.probe.profile import load_profile, with_profile


def test_busbw_factors_are_nccl_tests_performance_md():
    n = 8
    assert BUSBW_FACTOR["all_reduce"](n) == pytest.approx(2 * 7 / 8)
    assert BUSBW_FACTOR["all_gather"](n) == pytest.approx(7 / 8)
    assert BUSBW_FACTOR["reduce_scatter"](n) == pytest.approx(7 / 8)
    assert BUSBW_FACTOR["broadcast"](n) == BUSBW_FACTOR["send_recv"](n) == 1.0


def test_message_sizes_double_from_1k_to_256m():
    sizes = message_sizes()
    assert sizes[0] == 1024 and sizes[-1] == 256 * 1024**2 and len(sizes) == 19
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:], strict=False))


def test_alpha_beta_fit_recovers_a_synthetic_ring():
    alpha, bw, n = 20e-6, 3e9, 4
    points = [
        {"num_ranks": n, "size_bytes": s, "time_s": 2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bw}
        for s in message_sizes(1024, 64 * 1024**2)
    ]
    got_alpha, got_bw = fit_alpha_beta(points)
    assert got_alpha == pytest.approx(alpha, rel=1e-6) and got_bw == pytest.approx(bw, rel=1e-6)
    # an all-gather's ring: n-1 steps and (n-1)/n of the gathered buffer
    gathers = [
        {
            "op": "all_gather",
            "num_ranks": n,
            "size_bytes": s,
            "time_s": (n - 1) * 3 * alpha + (n - 1) / n * s / (bw / 2),
        }
        for s in message_sizes(1024, 2**26)
    ]
    got_alpha, got_bw = fit_alpha_beta(gathers)
    assert got_alpha == pytest.approx(3 * alpha, rel=1e-6) and got_bw == pytest.approx(bw / 2, rel=1e-6)


@pytest.mark.alone  # bounds on measured host overheads
@pytest.mark.dist(timeout=120)
def test_cpu_probe_on_two_gloo_ranks_writes_a_profile_that_estimate_takes(tmp_path, capsys):
    rc = main(
        [
            "probe",
            "--device",
            "cpu",
            "--nproc",
            "2",
            "--max-size",
            "64K",
            "--quick",
            "--sweeps",
            "2",
            "--out",
            str(tmp_path),
            "--name",
            "t2",
            "--timeout",
            "120",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    path = tmp_path / "t2.yaml"
    assert out["path"] == str(path)
    doc = yaml.safe_load(path.read_text())
    rows = doc["measurements"]["collectives"]
    assert {r["op"] for r in rows} == set(OPS)
    assert {r["size_bytes"] for r in rows} == set(message_sizes(1024, 64 * 1024))
    for r in rows:  # nccl-tests: algbw = size / time, busbw = algbw x factor(n)
        assert r["num_ranks"] == 2 and r["scope"] == "intra"
        assert r["algbw_bytes_per_s"] == pytest.approx(r["size_bytes"] / r["time_s"])
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"] * BUSBW_FACTOR[r["op"]](2))
        assert len(r["sweeps_s"]) == 2 and r["time_s"] == pytest.approx(statistics.median(r["sweeps_s"]))
    assert doc["summary"]["collective_sweeps"] == 2  # and how far apart the sweeps were, per collective
    spread = {
        f"intra {op}": statistics.median(
            (max(r["sweeps_s"]) - min(r["sweeps_s"])) / r["time_s"] for r in rows if r["op"] == op
        )
        for op in OPS
    }
    assert doc["summary"]["sweep_spread"] == pytest.approx(spread, abs=1e-3)
    assert {g["dtype"] for g in doc["measurements"]["gemm"]} >= {"fp32"}
    link = doc["intra_node_link"]
    assert link["bw_gb_s"] > 0 and link["latency_us"] > 0
    profile = load_profile(path)
    assert profile.label.startswith("profile: t2 (measured ") and profile.gpu == "cpu"
    cluster = with_profile(make_cluster(num_gpus=2, gpu="cpu"), path)
    assert cluster.intra_link.bw_bytes_per_s == pytest.approx(link["bw_gb_s"] * 1e9)
    assert cluster.gpu.fp32_flops == pytest.approx(doc["gpu_overrides"]["fp32_tflops"] * 1e12)
    assert cluster.collective_efficiency == 1.0 and cluster.profile == profile.label
    # overlap: the fraction of an all-reduce hidden behind GEMMs, recomputed from the timed runs
    overlap = doc["measurements"]["overlap"]
    hidden = sorted(
        min(
            1.0,
            max(
                0.0,
                (r["collective_s"] + r["compute_s"] - r["both_s"]) / min(r["collective_s"], r["compute_s"]),
            ),
        )
        for r in overlap["runs"]
    )
    assert overlap["num_ranks"] == 2 and overlap["gemms"] >= 1 and len(hidden) % 2 == 1
    assert overlap["dp_overlap_fraction"] == pytest.approx(hidden[len(hidden) // 2])
    assert cluster.dp_overlap_fraction == pytest.approx(doc["cluster"]["dp_overlap_fraction"], abs=1e-3)
    assert cluster.dp_overlap_fraction == pytest.approx(overlap["dp_overlap_fraction"], abs=1e-3)
    # the ranks share the node's cores: the profile says how many (pipeline.shared_core_bubble_fraction)
    assert cluster.cores_per_node == doc["cluster"]["cores_per_node"] == len(os.sched_getaffinity(0))
    # all-gather and reduce-scatter fitted on their own, applied as multiples of the all-reduce fit
    base = doc["intra_node_link"]
    fits = doc["intra_node_collectives"]
    assert set(fits) == {"all_gather", "reduce_scatter"}

    def ratio(key: str, op: str) -> float:  # a term the short sweep cannot resolve (inf bandwidth) stays x1
        a, b = fits[op][key], base[key]
        return a / b if 0 < a < math.inf and 0 < b < math.inf else 1.0

    for op, latency, bw in cluster.collective_scales:
        assert latency == pytest.approx(ratio("latency_us", op)) and bw == pytest.approx(ratio("bw_gb_s", op))
        assert math.isfinite(latency) and math.isfinite(bw)
    # host time per eager operator (CPU only): a trial block's operators, timed on every rank
    ops = doc["measurements"]["op_overhead"]
    assert sum(BLOCK_OPS[True]) <= ops["ops_per_step"] <= sum(BLOCK_OPS[True]) + 5  # + .sum() and its grad
    assert len(ops["per_rank_s"]) == 2 and 0 < ops["op_overhead_s"] < 1e-3
    assert cluster.gpu.host.op_overhead_s == pytest.approx(ops["op_overhead_s"], rel=1e-3)
    # a DTensor operator costs the host more than a plain one (sharding propagation, wrapping)
    assert ops["dtensor_ops_per_step"] > 0 and ops["dtensor_op_overhead_s"] > ops["op_overhead_s"]
    assert cluster.gpu.host.dtensor_op_overhead_s == pytest.approx(ops["dtensor_op_overhead_s"], rel=1e-2)
    # a TP collective issued by a DTensor redistribution, beyond the direct call (the median collective;
    # a difference of two CPU timings, so clipped at 0 on a loaded machine), scaled by the ranks' share of a
    # core where they outnumber the cores
    assert ops["dtensor_collective_cpu_share"] == max(1.0, 2 / len(os.sched_getaffinity(0)))
    assert set(ops["dtensor_collective_extra_s"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    per_collective = ops["dtensor_collective_overhead_s"]
    median = statistics.median(ops["dtensor_collective_extra_s"].values())
    assert per_collective == pytest.approx(max(0.0, median))
    assert cluster.gpu.host.dtensor_collective_overhead_s == pytest.approx(per_collective, rel=1e-2, abs=1e-7)
    # the kinds stay measurements: one cost for all (HostProfile.dtensor_collective_overhead_s); a profile
    # written before that lists them per kind still loads, to the same cluster
    assert "dtensor_collective_op_overhead_us" not in doc["gpu_overrides"]
    legacy = tmp_path / "legacy.yaml"
    per_kind = {op: max(0.0, v) * 1e6 for op, v in ops["dtensor_collective_extra_s"].items()}
    overrides = {**doc["gpu_overrides"], "dtensor_collective_op_overhead_us": per_kind}
    legacy.write_text(yaml.safe_dump({**doc, "gpu_overrides": overrides}, sort_keys=False))
    assert with_profile(make_cluster(num_gpus=2, gpu="cpu"), legacy).gpu == dataclasses.replace(
        cluster.gpu, sources=(*cluster.gpu.sources[:-1], load_profile(legacy).label)
    )
    # host time per action of each torch pipeline schedule: the slope of step time over actions, per rank
    # the median of the sweeps, then the median rank; the interleaved runtime sends and receives apart
    pipe = doc["measurements"]["pipeline"]
    assert pipe["pairs"] == [[0, 1]] and pipe["microbatches"] == list(MICROBATCHES)
    for name in SCHEDULES:
        per_rank = [r[name] for r in pipe["per_rank_s"]]
        assert pipe["pipeline_action_s"][name] == pytest.approx(max(0.0, statistics.median(per_rank)))
        assert 0 < pipe["pipeline_action_s"][name] < 0.1
        measured = pipe["pipeline_action_s"][name]
        assert cluster.gpu.host.pipeline_action_s(name) == pytest.approx(measured, rel=1e-2)


def test_a_profile_for_another_gpu_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "gpu": "cpu", "gpu_overrides": {"gemm_efficiency": 0.3}}))
    with pytest.raises(
        ConfigError, match="measured on 'cpu' but the cluster uses 'h100-sxm'; pass --gpu cpu"
    ):
        with_profile(make_cluster(num_gpus=8), path)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"name": "p"}, "not a profile"),
        ({"gpu": "cpu", "gpu_overides": {}}, "unknown key 'gpu_overides'"),
        ({"gpu": "cpu", "gpu_overrides": {"gemm_eff": 0.5}}, "unknown key 'gemm_eff'"),
        ({"gpu": "cpu", "cluster": {"step_overhead_s": -1}}, "must be a number >= 0"),
        ({"gpu": "cpu", "cluster": {"shared_core_latency": 2}}, "'shared_core_latency' is a fraction"),
        ({"gpu": "cpu", "intra_node_link": {"latency_us": 3}}, "needs a positive 'bw_gb_s'"),
        (
            {"gpu": "cpu", "intra_node_link": {"bw_gb_s": 1}, "intra_node_collectives": {"send_recv": {}}},
            "intra_node_collectives: a mapping of all_gather, reduce_scatter",
        ),
        ({"gpu": "cpu", "intra_node_collectives": {"all_gather": {"bw_gb_s": 1}}}, "needs intra_node_link"),
        (
            {
                "gpu": "cpu",
                "intra_node_link": {"bw_gb_s": 1},
                "intra_node_collectives": {"reduce_scatter": {"latency_us": 9}},
            },
            "reduce_scatter needs a positive",
        ),
        (
            {"gpu": "cpu", "gpu_overrides": {"pipeline_action_us": {"zb": 3}}},
            "pipeline_action_us: unknown key 'zb'; allowed: 1f1b, gpipe, interleaved",
        ),
    ],
)
def test_bad_profiles_are_one_line_errors(tmp_path, doc, message):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message) as e:
        load_profile(path)
    assert "\n" not in str(e.value)


def test_collective_fits_become_finite_multiples_of_the_all_reduce_fit(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gpu": "cpu",
                "intra_node_link": {"bw_gb_s": 2.0, "latency_us": 100.0},
                "intra_node_collectives": {
                    "all_gather": {"bw_gb_s": 1.0, "latency_us": 50.0},
                    # a sweep of small messages only: the bandwidth is unresolved (inf)
                    "reduce_scatter": {"bw_gb_s": float("inf"), "latency_us": 300.0},
                },
            }
        )
    )
    cluster = with_profile(make_cluster(num_gpus=2, gpu="cpu"), path)
    assert cluster.collective_scales == (("all_gather", 0.5, 0.5), ("reduce_scatter", 3.0, 1.0))


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_bad_sweep_counts_are_one_line_usage_errors(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["probe", "--device", "cpu", "--sweeps", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1 and "--sweeps" in lines[0] and "Traceback" not in err


@pytest.mark.dist(timeout=150)
def test_a_probe_across_two_torchrun_agents_measures_the_link_between_nodes(tmp_path):
    """Two agents (``--nnodes 2``, one rank each, c10d rendezvous on loopback) run ``autotune probe`` as a
    user runs it across nodes: rank 0 writes a profile whose between-node link a 2-node cluster then uses."""
    port, env = (
        free_port(),
        {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "probe-2n",
        "-m",
        "autotune",
        "probe",
        "--device",
        "cpu",
        "--quick",
        "--max-size",
        "64K",
        "--sweeps",
        "1",
        "--out",
        str(tmp_path),
        "--name",
        "two-nodes",
    ]
    agents = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        logs = [a.communicate(timeout=240)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    path = tmp_path / "two-nodes.yaml"
    doc = yaml.safe_load(path.read_text())
    assert "2 node(s) x 1 ranks" in doc["source"] and "intra_node_link" not in doc  # one rank per node
    rows = doc["measurements"]["collectives"]
    assert {r["scope"] for r in rows} == {"inter"} and {r["op"] for r in rows} == set(OPS)
    link = doc["inter_node_link"]
    assert link["bw_gb_s"] > 0 and link["latency_us"] > 0
    catalog = make_cluster(num_gpus=2, gpu="cpu", gpus_per_node=1)
    cluster = with_profile(catalog, path)
    assert cluster.inter_link.latency_s == pytest.approx(link["latency_us"] * 1e-6)
    assert cluster.inter_link.bw_bytes_per_s == pytest.approx(link["bw_gb_s"] * 1e9)
    across = comm.group_link(cluster, 2, 1)  # a 2-rank group spans both nodes: it runs at the measured link
    assert across.num_nodes == 2 and across.latency_s == pytest.approx(cluster.inter_link.latency_s)


@pytest.mark.parametrize(
    "device, key",
    [
        ("NVIDIA GB200", "gb200"),  # contains "B200": the superchip's own entry must win
        ("NVIDIA GB300", "gb300"),
        ("NVIDIA B300 SXM6 AC", "b300"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H800", "h800"),
        ("NVIDIA H200", "h200"),
    ],
)
def test_the_device_name_picks_its_catalog_gpu(device, key):
    from autotune.cli.probe import _guess_gpu

    assert _guess_gpu(device) == key


def test_a_grace_hopper_superchip_is_not_taken_for_an_h200():
    """'NVIDIA GH200 480GB' contains 'H200', but its memory (96 or 144 GB) is not the H200's 141 GB: a
    one-line error with the fix, not a silent h200 profile."""
    from autotune.cli.probe import _guess_gpu
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="pass --gpu KEY"):
        _guess_gpu("NVIDIA GH200 480GB")
