"""`autotune report` on a study with measured AND simulated trials, stored the way the search stores them.

The measured trials come from a fake measuring backend run through the real `autotune search` (so `_record`
writes their user_attrs), then `--resume --backend simulate` adds predicted ones. The page must be
self-contained (no network reference of any kind) and every embedded figure a valid PNG.
"""

import base64
import dataclasses
import io
import json
import re
import types
from pathlib import Path

import matplotlib.image
import pytest
from PIL import Image

from autotune.backends.registry import BackendChoice
from autotune.cli import main
from autotune.costmodel import estimate
from autotune.report import kendall_tau, pareto_front
from autotune.trials.result import TrialResult, TrialStatus

# CP 1: the best DP8 plan and its DP4 x CP2 twin predict the same step (the ring attention hides under the
# attention), and Kendall tau of a tie is undefined
_ARGV = ("--model", "7b", "--gpus", "8", "--global-batch", "64", "--cp", "1", "--study", "mix", "--top", "3")
_FACTORS = (0.5, 0.9, None)  # measured = predicted x factor, in launch order; None: out of memory
_PNG = b"\x89PNG\r\n\x1a\n"


class _MeasuringBackend:
    """Stands in for torchrun: 'measures' a scaled prediction (no processes)."""

    name, measures = "fake-measure", True

    def __init__(self):
        self.calls = 0

    def run(self, request, report=None):
        factor = _FACTORS[self.calls % len(_FACTORS)]
        self.calls += 1
        if factor is None:
            return TrialResult(status=TrialStatus.OOM, error="CUDA out of memory (fake)", wall_s=1.0)
        est = estimate(request.model, request.cluster, request.plan)
        return TrialResult(
            status=TrialStatus.OK,
            tokens_per_s=est.tokens_per_s * factor,
            step_time_s=est.step_time_s / factor,
            step_time_cov=0.01,
            peak_memory_bytes=est.memory_bytes_per_gpu * 0.9,
            mfu=est.mfu * factor,
            wall_s=1.0,
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        backend = _MeasuringBackend()
        mp.setattr(
            "autotune.backends.registry.get_backend",
            lambda *a, **k: BackendChoice(backend=backend, frameworks=None),
        )
        assert main(["search", *_ARGV, "--trials", "3", "--out", str(out), "--quiet"]) == 0
    assert (
        main(
            [
                "search",
                *_ARGV,
                "--resume",
                "--backend",
                "simulate",
                "--trials",
                "4",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def report(runs):
    buf = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", buf)
        assert main(["report", "mix", "--out", str(runs), "--price-per-gpu-hour", "2.5", "--json"]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.slow
def test_the_report_has_measured_and_predicted_rows_and_the_model_error(report):
    sources = {row["measured"] for row in report["top"]}
    assert sources == {True, False}
    err = report["cost_model_error"]
    assert err["num_measured"] == 2
    assert err["mape"] == pytest.approx((1 / 0.5 - 1 + 1 / 0.9 - 1) / 2, rel=1e-6)
    # the top-2 predictions are within 2% of each other, so x0.5 vs x0.9 flips their measured order
    assert err["kendall_tau"] == pytest.approx(-1.0)
    assert report["failed_trials"] and next(iter(report["failed_trials"])).startswith("oom")
    pruned = report["pruned_enumeration"]
    assert pruned and all(isinstance(n, int) for n in pruned.values())
    assert all(
        row["dollars_per_mtok"] == pytest.approx(2.5 * 8 / 3600 / row["tokens_per_s"] * 1e6)
        for row in report["top"]
    )
    assert report["pareto"] and report["importances"]
    top = report["top"][0]
    assert set(top["time_breakdown_s"]) == {
        "compute",
        "recompute",
        "TP comm",
        "CP comm",
        "PP bubble + p2p",
        "exposed DP comm",
        "optimizer",
        "offload",
        "host overhead",
        "EP all-to-all",
    }


@pytest.mark.slow
def test_the_html_is_self_contained_and_every_figure_is_a_valid_png(runs, report):
    html = (runs / "mix" / "report" / "index.html").read_text()
    lowered = html.lower()
    for needle in ("http://", "https://", "//cdn", "<link", "<script", "@import", "url("):
        assert needle not in lowered, needle
    sources = re.findall(r'src="([^"]*)"', html)
    assert len(sources) == 6  # step time, memory, Pareto, history, importances, model error
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(_PNG)
        Image.open(io.BytesIO(data)).verify()
        pixels = matplotlib.image.imread(io.BytesIO(data), format="png")
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    for words in (
        "Top plans",
        "Where the step time goes",
        "Throughput vs memory headroom",
        "Kendall tau",
        "Proposals pruned without launching",
        "Trials that launched and failed",
        "optuna-dashboard",
    ):
        assert words in html


@pytest.mark.slow
def test_the_markdown_names_its_figures_next_to_it(runs, report):
    folder = runs / "mix" / "report"
    md = (folder / "report.md").read_text()
    names = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(names) == 6 and all((folder / n).read_bytes().startswith(_PNG) for n in names)
    assert "| measured |" in md and "| predicted |" in md
    assert str(folder / "index.html") in report["files"]


@pytest.mark.slow
def test_the_study_opens_in_optuna_dashboard(runs):
    dashboard = pytest.importorskip("optuna_dashboard")
    from wsgiref.util import setup_testing_defaults

    from optuna.storages import RDBStorage

    storage = RDBStorage(f"sqlite:///{runs / 'mix' / 'study.db'}")
    app = dashboard.wsgi(storage)
    got = {}
    env = {"PATH_INFO": "/api/studies", "REQUEST_METHOD": "GET"}
    setup_testing_defaults(env)
    body = b"".join(app(env, lambda status, headers, exc=None: got.update(status=status)))
    assert got["status"].startswith("200")
    names = [s["study_name"] for s in json.loads(body)["study_summaries"]]
    assert names == ["mix"]


@pytest.mark.slow
def test_a_simulated_only_study_reports_without_the_error_figure(tmp_path, capsys):
    argv = ["--model", "7b", "--gpus", "8", "--global-batch", "64", "--top", "2", "--out", str(tmp_path)]
    assert main(["search", *argv, "--study", "sim", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", "sim", "--out", str(tmp_path)]) == 0
    html = (tmp_path / "sim" / "report" / "index.html").read_text()
    assert "No measured trial yet" in html and html.count("data:image/png;base64,") == 5


def test_a_missing_study_is_one_line_exit_2(tmp_path, capsys):
    assert main(["report", "nothing", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no study 'nothing'" in err and len(err.strip().splitlines()) == 1


def test_the_stacked_time_groups_add_up_to_the_step_time_with_a_calibrated_overhead():
    from autotune.catalog import load_model, make_cluster
    from autotune.plan import ParallelPlan
    from autotune.report import time_groups

    cluster = dataclasses.replace(
        make_cluster(num_gpus=8, gpu="h100-sxm"), step_overhead_s=0.05, microbatch_overhead_s=0.01
    )
    plan = ParallelPlan(dp=8, global_batch=64, micro_batch=2, seq_len=4096)
    est = estimate(load_model("7b"), cluster, plan)
    groups = time_groups(est)
    assert groups["host overhead"] == pytest.approx(0.05 + 4 * 0.01)
    assert sum(groups.values()) == pytest.approx(est.step_time_s)


def test_kendall_tau_and_the_pareto_front():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert kendall_tau([1], [1]) is None and kendall_tau([1, 1], [2, 2]) is None
    row = lambda t, h: types.SimpleNamespace(tokens_per_s=t, headroom_bytes=h)  # noqa: E731
    a, b, c, d = row(100, 1), row(90, 5), row(80, 3), row(70, 9)
    assert pareto_front([c, a, d, b]) == [a, b, d]  # c is beaten by b on both


@pytest.mark.slow
def test_a_real_cpu_search_reports_its_measurement(tmp_path, capsys):
    """Two gloo processes measure one plan for real (~15 s), then the report shows it as measured."""
    argv = [
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--trials",
        "1",
        "--top",
        "1",
        "--global-batch",
        "8",
        "--study",
        "cpu",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["report", "cpu", "--out", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["top"][0]["measured"] is True and out["cost_model_error"]["num_measured"] == 1
    assert Path(out["files"][0]).read_text().count("data:image/png;base64,") >= 5
