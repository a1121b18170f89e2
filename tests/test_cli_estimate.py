"""`autotune estimate`: the JSON contract; infeasible is an answer (exit 0), bad input one line (exit 2)."""

import json
import subprocess
import sys

import pytest

from autotune.cli import main

_KEYS = {
    "feasible",
    "reasons",
    "memory_bytes_per_gpu",
    "memory_breakdown",
    "step_time_s",
    "time_breakdown",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "tflops_per_gpu",
    "plan",
}


def _estimate_json(capsys, *argv):
    assert main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_documented_keys(capsys):
    out = _estimate_json(
        capsys,
        "--model",
        "70b",
        "--gpus",
        "16",
        "--tp",
        "8",
        "--sharding",
        "fsdp-full",
        "--global-batch",
        "512",
        "--seq-len",
        "4096",
        "--recompute",
        "full",
        "--sequence-parallel",
    )
    assert _KEYS <= set(out)
    assert out["feasible"] is True and out["reasons"] == []
    assert out["plan"]["dp"] == 2 and out["plan"]["tp"] == 8
    assert out["tokens_per_s"] == pytest.approx(out["tokens_per_s_per_gpu"] * 16)
    assert 0.15 < out["mfu"] < 0.7  # FSDP regathers per micro-batch: 256 of them here
    assert sum(v for k, v in out["memory_breakdown"].items() if k != "host_bytes_per_node") == pytest.approx(
        out["memory_bytes_per_gpu"]
    )


def test_infeasible_plan_still_answers(capsys):
    out = _estimate_json(capsys, "--model", "70b", "--gpus", "1", "--global-batch", "8")
    assert out["feasible"] is False
    assert any("out of memory" in r for r in out["reasons"])
    assert out["step_time_s"] > 0


def test_human_output_shows_both_breakdowns(capsys):
    assert main(["estimate", "--model", "7b", "--gpus", "8", "--tp", "2", "--global-batch", "64"]) == 0
    text = capsys.readouterr().out
    for needle in (
        "memory per GPU",
        "optimizer states",
        "activations",
        "step time",
        "compute",
        "MFU",
        "binds:",
    ):
        assert needle in text


def test_a_reserved_peak_above_the_device_that_fits_allocated_says_why(capsys):
    """Llama 3 8B at 256k under DeepSpeed-Ulysses CP 8: the reserved peak (with the allocator's slack) is
    above the 80 GB, the allocated one below it, so the plan is feasible and the output says why; a plan
    whose reserved peak fits has no such line."""
    argv = ["estimate", "--model", "llama3-8b", "--gpus", "8", "--framework", "deepspeed", "--cp", "8"]
    argv += ["--cp-comm", "a2a", "--sharding", "zero3", "--micro-batch", "1", "--global-batch", "8"]
    assert main([*argv, "--seq-len", "262144", "--recompute", "full"]) == 0
    text = capsys.readouterr().out
    assert "verdict   feasible" in text and "(105%)" in text
    assert "the allocated peak fits: torch's caching allocator frees its cached blocks" in text
    assert main([*argv, "--seq-len", "65536", "--recompute", "full"]) == 0
    assert "the allocated peak fits" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "71b", "--gpus", "8"], "unknown model '71b'"),
        (["--model", "70b", "--gpus", "16", "--gpu", "h101"], "unknown GPU 'h101'"),
        (["--model", "70b", "--gpus", "16", "--tp", "16"], "TP 16 does not divide KV heads 8"),
        (["--model", "70b", "--gpus", "12", "--gpus-per-node", "8"], "not a multiple of --gpus-per-node 8"),
        (
            ["--model", "70b", "--gpus", "16", "--tp", "8", "--global-batch", "3"],
            "not divisible by DP x micro-batch",
        ),
        (["--model", "7b", "--gpus", "8", "--host-memory-gib", "nan"], "--host-memory-gib: host RAM"),
        (["--model", "7b", "--gpus", "8", "--host-memory-gib", "-5"], "--host-memory-gib: host RAM"),
        (
            ["--model", "qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--moe-dispatcher", "hybridep"],
            "framework fsdp has no moe-dispatcher hybridep",
        ),
        (["--model", "70b", "--gpus", "16", "--ep", "2"], "--ep 2: 70b is a dense model"),
        (["--model", "70b", "--gpus", "16", "--tp", "2", "--etp", "2"], "--etp 2: 70b is a dense model"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_console_script_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "estimate", "--model", "nope", "--gpus", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "unknown model 'nope'" in proc.stderr


def test_megatron_memory_options_reach_the_plan(capsys):
    out = _estimate_json(
        capsys,
        "--model",
        "llama3-70b",
        "--gpus",
        "64",
        "--gpu",
        "gb200",
        "--framework",
        "megatron",
        "--sharding",
        "fsdp-full",
        "--micro-batch",
        "2",
        "--global-batch",
        "256",
        "--precision",
        "fp8",
        "--offload-activation-layers",
        "40",
        "--precision-aware-optimizer",
    )
    assert out["plan"]["offload_activation_layers"] == 40 and out["plan"]["precision_aware_optimizer"]
    assert out["feasible"] and out["memory_breakdown"]["host_bytes_per_node"] > 0


def test_grad_reduce_dtype_reaches_the_plan(capsys):
    out = _estimate_json(
        capsys,
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--framework",
        "megatron",
        "--sharding",
        "zero1",
        "--grad-reduce-dtype",
        "bf16",
    )
    assert out["plan"]["grad_reduce_dtype"] == "bf16"
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--grad-reduce-dtype", "bf16"]) == 2
    assert "grad-reduce-dtype needs --framework megatron" in capsys.readouterr().err


def test_the_plan_line_names_the_moe_routing_it_was_priced_with(capsys):
    argv = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--ep", "8", "--framework", "megatron"]
    argv += ["--sharding", "zero1", "--global-batch", "128", "--seq-len", "4096"]
    assert main(["estimate", *argv, "--moe-capacity-factor", "1.25", "--moe-dispatcher", "allgather"]) == 2
    assert "needs Megatron's alltoall dispatcher" in capsys.readouterr().err
    assert main(["estimate", *argv, "--moe-capacity-factor", "1.25", "--moe-load-imbalance", "1.2"]) == 0
    assert "EP8 drop@1.25 skew1.2 mbs1x8" in capsys.readouterr().out


def test_deepseek_v3_config_with_its_mtp_module_plans_on_megatron(capsys, tmp_path):
    """DeepSeek-V3's config.json keeps ``num_nextn_predict_layers: 1``: the main model's counts as published,
    the module apart under ``model``; other frameworks say how to plan it in one line."""
    from autotune.catalog import _data

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**_data("models.yaml")["deepseek-v3"], "num_nextn_predict_layers": 1}))
    model = ["--model", str(config), "--gpus", "256", "--global-batch", "2048"]
    megatron = ["--pp", "8", "--ep", "32", "--framework", "megatron", "--sharding", "zero1"]
    interleaved = ["--recompute", "full", "--schedule", "interleaved", "--virtual-stages", "2"]
    out = _estimate_json(capsys, *model, *megatron, *interleaved)
    assert out["model"]["mtp_layers"] == 1 and out["model"]["mtp_params"] == pytest.approx(11.6e9, rel=0.01)
    assert out["model"]["total_params"] == pytest.approx(671e9, rel=0.01)
    assert main(["estimate", *model, "--ep", "32", "--sharding", "fsdp-full"]) == 2
    err = capsys.readouterr().err
    assert "--framework megatron" in err and len(err.strip().splitlines()) == 1
