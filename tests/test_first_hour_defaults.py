"""A new user's first hour (issue 25), items 8-11 and the minor ones: defaults that would mislead are
adjusted or noted, study names and counts that run nothing are refused in one line, hints name the fix, and
``autotune --help`` is quick. Items 1-7 are in test_first_hour.py; each test failed on the code before the fix
(see the commit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import SIMULATE, one_line, run_cli


# ---------------------------------------------------------------------------------------------- 8 defaults
@pytest.mark.slow
def test_8_device_cpu_plans_for_the_cpu_and_says_so(capsys, tmp_path):
    """Was: CPU trials priced as H100s (12.1M tok/s predicted vs 3,079 measured), H100 launch files."""
    code, out, err = run_cli(
        capsys,
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        *SIMULATE,
        "--out",
        str(tmp_path),
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["cluster"] == "1x2 cpu" and "--device cpu: the trials are priced as" in err
    code, out, _ = run_cli(
        capsys,
        "search",
        "--model",
        "tiny",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--gpu",
        "h100-sxm",
        "--global-batch",
        "8",
        "--seq-len",
        "64",
        *SIMULATE,
        "--out",
        str(tmp_path / "b"),
        "--json",
    )
    assert code == 0 and json.loads(out)["cluster"] == "1x2 h100-sxm"  # an explicit --gpu stands


@pytest.mark.parametrize("command", ["estimate", "search"])
def test_8_a_pinned_sharding_implies_its_framework(capsys, tmp_path, command):
    extra = [*SIMULATE, "--out", str(tmp_path)] if command == "search" else []
    code, out, err = run_cli(
        capsys,
        command,
        "--model",
        "7b",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--sharding",
        "zero3",
        "--json",
        *extra,
    )
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["sharding"], plan["framework"]) == ("zero3", "deepspeed")


# ---------------------------------------------------------------------------------------------- 9 names
@pytest.mark.parametrize("name", ["", ".", "..", "../elsewhere", "a/b", "x" * 300, "-rf"])
def test_9_a_study_name_is_a_plain_name(capsys, tmp_path, name):
    out = tmp_path / "runs"
    code, _, err = run_cli(
        capsys,
        "search",
        "--model",
        "tiny",
        "--gpus",
        "1",
        "--gpu",
        "cpu",
        *SIMULATE,
        f"--study={name}",
        "--out",
        str(out),
    )
    assert code == 2 and "--study" in one_line(err)
    assert list(tmp_path.iterdir()) == []  # nothing in --out, nothing beside it


# ---------------------------------------------------------------------------------------------- 10 counts
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trials", "0"], "--trials 0 runs nothing"),
        (["--timeout", "-5"], "--timeout -5: expected seconds > 0"),
        (["--timeout", "0"], "--timeout 0: expected seconds > 0"),
    ],
)
def test_10_counts_that_run_nothing_are_refused(capsys, tmp_path, argv, message):
    code, _, err = run_cli(
        capsys,
        "search",
        "--model",
        "tiny",
        "--gpus",
        "1",
        "--gpu",
        "cpu",
        *SIMULATE,
        *argv,
        "--out",
        str(tmp_path / "runs"),
    )
    assert code == 2 and message in one_line(err)
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------- 11 reasons
def test_11_fp8_on_a100_gives_the_real_reason_in_search(capsys, tmp_path):
    code, _, err = run_cli(
        capsys,
        "search",
        "--model",
        "7b",
        "--gpus",
        "8",
        "--gpu",
        "a100-80gb",
        "--precision",
        "fp8",
        *SIMULATE,
        "--out",
        str(tmp_path / "runs"),
    )
    assert code == 2 and "a100-80gb has no fp8 tensor cores" in one_line(err)


def test_11_emit_of_a_plan_that_cannot_fit_warns(capsys, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"global_batch": 8, "seq_len": 4096}) + "\n")
    code, out, err = run_cli(
        capsys, "emit", "--plan", str(plan), "--model", "70b", "--gpus", "1", "--out", str(tmp_path / "out")
    )
    assert code == 0 and out  # the files are still written
    assert "warning" in err and "out of memory" in one_line(err)


# ---------------------------------------------------------------------------------------------- minor
@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (
            ["--model", "tiny", "--gpus", "1", "--gpu", "h100"],
            "did you mean h100-96gb or h100-nvl or h100-pcie or h100-sxm?",
        ),
        (
            ["--model", "tiny", "--gpus", "1", "--gpu", "H100"],
            "did you mean h100-96gb or h100-nvl or h100-pcie or h100-sxm?",
        ),
        (["--model", "meta-llama/Llama-3-8B", "--gpus", "8"], "Hugging Face repo id"),
    ],
)
def test_minor_did_you_mean(capsys, argv, hint):
    code, _, err = run_cli(capsys, "estimate", *argv)
    assert code == 2 and hint in one_line(err)


def test_minor_a_tiny_model_shows_its_size(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--model", "tiny", "--gpus", "1", "--gpu", "cpu")
    assert code == 0 and "0.00B" not in out and "M parameters)" in out


@pytest.mark.parametrize(
    ("argv", "note"),
    [
        (
            ["--model", "tiny", "--gpus", "2", "--gpu", "cpu", "--seq-len", "4096"],
            "above tiny's max_position",
        ),
        pytest.param(
            ["--model", "llama3-405b", "--gpus", "16384"],
            "512 sequences per step on 16,384 GPUs",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["--model", "7b", "--gpus", "100000"],
            "the default ~4M-token batch became 3,125 sequences (12.8M",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_minor_a_poor_default_is_noted(capsys, tmp_path, argv, note):
    code, _, err = run_cli(capsys, "search", *argv, *SIMULATE, "--quiet", "--out", str(tmp_path))
    assert code == 0 and note in err


def test_minor_help_imports_no_command(tmp_path):
    """Was ~0.9 s on this machine: --help imported every command (scale -> search -> optuna, sqlalchemy)."""
    code = (
        "import io, sys, contextlib\nfrom autotune.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "assert 'worker' in out.getvalue() and 'retune' in out.getvalue()\n"
        "print(sorted(m for m in ('optuna', 'sqlalchemy', 'autotune.search', 'autotune.costmodel') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
