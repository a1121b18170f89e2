"""`autotune emit`: plan.json alone is enough; bad input is one line on stderr and exit 2."""

from __future__ import annotations

import json

import pytest
from emit_cases import CASES

from autotune.cli import main


def _error(capsys) -> str:
    """The one error line; a plan the cost model calls infeasible also gets its warning line first."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("autotune emit: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("autotune emit: error: ")
    return lines[0]


def test_plan_json_alone_reemits_everything(emitted, tmp_path, capsys):
    out = tmp_path / "again"
    assert main(["emit", "--plan", str(emitted("hsdp") / "plan.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split("\n")[:-1]
    assert sorted(printed) == sorted(str(p) for p in out.rglob("*") if p.is_file())
    for name in ("accelerate_fsdp.yaml", "torchtitan.toml", "trial/trial.json", "launch_torchrun.sh"):
        assert (out / name).read_text() == (emitted("hsdp") / name).read_text()


def test_existing_files_need_force(emitted, tmp_path, capsys):
    argv = ["emit", "--plan", str(emitted("zero0") / "plan.json"), "--out", str(tmp_path)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 2
    assert "already exists; pass --force" in _error(capsys)
    assert main([*argv, "--force"]) == 0


def test_bare_plan_needs_model_and_cluster(tmp_path, capsys):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(CASES["zero0"].build()[0].to_dict()))
    out = str(tmp_path / "out")
    assert main(["emit", "--plan", str(bare), "--out", out]) == 2
    assert "names no model; pass --model" in _error(capsys)
    assert main(["emit", "--plan", str(bare), "--out", out, "--model", "7b"]) == 2
    assert "names no cluster; pass --gpus" in _error(capsys)
    assert main(["emit", "--plan", str(bare), "--out", out, "--model", "7b", "--gpus", "8"]) == 0


def test_flags_override_the_recorded_cluster(emitted, tmp_path, capsys):
    plan_json = str(emitted("zero0") / "plan.json")  # 8 GPUs
    assert main(["emit", "--plan", plan_json, "--out", str(tmp_path / "a"), "--gpus", "16"]) == 2
    assert "does not equal the 16 GPUs" in _error(capsys)
    assert (
        main(
            ["emit", "--plan", plan_json, "--out", str(tmp_path / "b"), "--gpus", "8", "--gpus-per-node", "4"]
        )
        == 0
    )
    assert json.loads((tmp_path / "b" / "plan.json").read_text())["cluster"]["num_nodes"] == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"plan": {"tp": 1}, "extra": 1}', "unknown key 'extra'"),
        ('{"tp": 1, "seq_len": 2048}', "missing plan field 'global_batch'"),
    ],
)
def test_bad_plan_files_are_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "plan.json"
    path.write_text(content)
    argv = ["emit", "--plan", str(path), "--out", str(tmp_path / "o"), "--model", "7b", "--gpus", "8"]
    assert main(argv) == 2
    assert message in _error(capsys)


def test_gpu_without_gpus_is_an_error(emitted, tmp_path, capsys):
    plan_json = str(emitted("zero0") / "plan.json")
    argv = ["emit", "--plan", plan_json, "--out", str(tmp_path), "--gpu", "a100-sxm"]
    assert main(argv) == 2
    assert "need --gpus" in _error(capsys)


def test_image_is_a_parameter(emitted, tmp_path, capsys):
    argv = ["emit", "--plan", str(emitted("hsdp") / "plan.json"), "--out", str(tmp_path)]
    assert main([*argv, "--image", "registry.example/me/train:1"]) == 0
    job = (tmp_path / "pytorchjob.yaml").read_text()
    assert job.count("image: registry.example/me/train:1") == 2  # Master and Worker
