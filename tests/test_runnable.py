"""A search whose best plan's own launch file cannot be written for the model (Megatron-LM's flags cannot
build gpt-oss) also writes the best ranked plan whose file can, in ``best_runnable/``."""

from __future__ import annotations

import json

from autotune.cli import main


def _search(tmp_path, model, *extra):
    args = ["search", "--model", model, "--gpus", "8", "--backend", "simulate", "--out", str(tmp_path)]
    return main([*args, "--global-batch", "64", "--seq-len", "4096", *extra])


def test_gpt_oss_gets_the_best_plan_it_can_launch_beside_the_fastest(tmp_path, capsys):
    assert _search(tmp_path, "gpt-oss-20b", "--pp", "1", "--cp", "1") == 0
    text = capsys.readouterr().out
    (root,) = tmp_path.iterdir()
    out = json.loads((root / "summary.json").read_text())
    assert out["plan"]["framework"] == "megatron" and not (root / "best" / "megatron_args.txt").exists()
    (why,) = out["not_written"].values()
    assert any("gpt-oss's expert and router biases" in r for r in why)
    runnable = out["runnable"]
    assert runnable["plan"]["framework"] in ("fsdp", "deepspeed") and runnable["rank"] > 1
    assert runnable["predicted_tokens_per_s"] <= out["tokens_per_s"]
    written = {p.name for p in (root / "best_runnable").iterdir()}
    assert {"plan.json", "summary.md", "launch_torchrun.sh"} <= written
    plan = json.loads((root / "best_runnable" / "plan.json").read_text())
    assert plan["plan"] == runnable["plan"]
    assert "not written  megatron_args.txt: " in text and "runnable  #" in text
    summary = (root / "best" / "summary.md").read_text()
    assert "## Runnable instead" in summary and f"#{runnable['rank']}, `{runnable['summary']}`" in summary


def test_a_best_plan_that_launches_leaves_no_runnable_folder(tmp_path, capsys):
    assert _search(tmp_path, "llama3-8b", "--framework", "megatron") == 0
    stale = tmp_path / "llama3-8b-8xh100-sxm" / "best_runnable"
    assert not stale.exists()
    stale.mkdir()
    (stale / "summary.md").write_text("from an earlier run\n")
    capsys.readouterr()
    assert _search(tmp_path, "llama3-8b", "--framework", "megatron", "--resume", "--trials", "0") == 0
    out = json.loads((tmp_path / "llama3-8b-8xh100-sxm" / "summary.json").read_text())
    assert "not_written" not in out and "runnable" not in out
    assert not stale.exists() and "runnable" not in capsys.readouterr().out
