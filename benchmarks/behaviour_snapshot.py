"""Behaviour snapshot: run a fixed set of `autotune estimate/search/report` commands and keep their outputs.

A refactor that claims "no behaviour change" reruns this and diffs against the committed snapshot:

    python benchmarks/behaviour_snapshot.py --out /tmp/snap
    diff -r benchmarks/results/behaviour_snapshot /tmp/snap

Only the cost model runs (search uses the simulate backend with a fixed seed), so the outputs are
deterministic (with PYTHONHASHSEED fixed); the scratch directory's path is replaced by `<RUNS>` so that
they compare byte for byte.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "behaviour_snapshot"

ESTIMATES: dict[str, list[str]] = {
    "estimate_70b_16xa100_tp8_pp2": [
        "--model",
        "70b",
        "--gpus",
        "16",
        "--gpu",
        "a100-80gb",
        "--tp",
        "8",
        "--pp",
        "2",
    ],
    "estimate_70b_16xa100_zero3": [
        "--model",
        "70b",
        "--gpus",
        "16",
        "--gpu",
        "a100-80gb",
        "--tp",
        "8",
        "--sharding",
        "zero3",
        "--framework",
        "deepspeed",
        "--recompute",
        "full",
    ],
    "estimate_8b_8xh100_fp8": [
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--gpu",
        "h100-sxm",
        "--precision",
        "fp8",
        "--sharding",
        "fsdp-full",
        "--compile",
    ],
    "estimate_mixtral_16xh100_ep8": [
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "16",
        "--gpu",
        "h100-sxm",
        "--ep",
        "8",
        "--framework",
        "megatron",
        "--sharding",
        "zero1",
        "--recompute",
        "full",
    ],
    "estimate_405b_megatron_pp16": [
        "--model",
        "llama3-405b",
        "--gpus",
        "1024",
        "--gpu",
        "h100-sxm",
        "--tp",
        "8",
        "--pp",
        "16",
        "--framework",
        "megatron",
        "--schedule",
        "interleaved",
        "--virtual-stages",
        "2",
        "--sequence-parallel",
        "--sharding",
        "zero1",
    ],
    "estimate_tiny_cpu_fsdp": ["--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--sharding", "fsdp-full"],
    "estimate_tiny_cpu_tp2": ["--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--tp", "2"],
    "estimate_tiny_cpu_pp2": [
        "--model",
        "tiny",
        "--gpu",
        "cpu",
        "--gpus",
        "2",
        "--pp",
        "2",
        "--schedule",
        "gpipe",
    ],
    "estimate_tiny_cpu_zero3": [
        "--model",
        "tiny",
        "--gpu",
        "cpu",
        "--gpus",
        "2",
        "--framework",
        "deepspeed",
        "--sharding",
        "zero3",
    ],
}

SEARCHES: dict[str, list[str]] = {
    "search_7b_8xh100": ["--model", "7b", "--gpus", "8", "--trials", "4", "--seed", "0"],
    "search_tiny_cpu": [
        "--model",
        "tiny",
        "--gpu",
        "cpu",
        "--gpus",
        "2",
        "--device",
        "cpu",
        "--trials",
        "3",
        "--seed",
        "0",
    ],
}


def _autotune(args: list[str], *, cwd: Path) -> str:
    """One CLI run; stdout, then stderr under a marker when there is any, then the exit code."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the report orders tied importances by set iteration
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    text = proc.stdout
    if proc.stderr:
        text += "\n--- stderr ---\n" + proc.stderr
    return text + f"\n--- exit {proc.returncode} ---\n"


def _write(out: Path, name: str, text: str, scratch: Path) -> None:
    (out / name).write_text(text.replace(str(scratch), "<RUNS>"))


def snapshot(out: Path) -> list[str]:
    """Write every command's output under `out`; return the file names."""
    out.mkdir(parents=True, exist_ok=True)
    names = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name, args in ESTIMATES.items():
            for suffix, extra in ((".txt", []), (".json", ["--json"])):
                _write(out, name + suffix, _autotune(["estimate", *args, *extra], cwd=scratch), scratch)
                names.append(name + suffix)
        for name, args in SEARCHES.items():
            runs = scratch / "runs"
            cmd = ["search", *args, "--backend", "simulate", "--study", name, "--out", str(runs), "--json"]
            _write(out, name + ".json", _autotune(cmd, cwd=scratch), scratch)
            report = _autotune(["report", name, "--out", str(runs), "--json"], cwd=scratch)
            _write(out, name + "_report.json", report, scratch)
            names += [name + ".json", name + "_report.json"]
            for emitted in sorted((runs / name / "best").rglob("*")):
                if emitted.is_file():
                    flat = name + "_best_" + str(emitted.relative_to(runs / name / "best")).replace("/", "_")
                    _write(out, flat, emitted.read_text(), scratch)
                    names.append(flat)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"directory (default {DEFAULT_OUT})")
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    names = snapshot(args.out)
    print(f"{len(names)} files in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
