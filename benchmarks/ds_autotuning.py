"""Head to head with DeepSpeed Autotuning, both run for real on this CPU (gloo, 2 ranks, ``tiny``, global
batch 4 x 64 tokens) on the space DeepSpeed covers: ZeRO stage 0-3 x micro-batch, data parallel only
(``benchmarks/data/ds_covered_space.yaml`` for autotune).

1. DeepSpeed: ``deepspeed --autotuning run --num_gpus 2 benchmarks/_ds_autotune_train.py --deepspeed_config``
   with ``zero_optimization.stage: [0, 1, 2, 3]``, fast mode (its default), ``max_train_batch_size`` = the
   global batch and ``max_train_micro_batch_size_per_gpu`` = the per-rank batch, ``LOCAL_SIZE=2``
   (PLATFORM.md). Its answer is ``autotuning_results/ds_config_optimal.json`` (it exits 0 even when every
   experiment failed).
2. autotune: ``autotune search --device cpu --backend deepspeed --space ds_covered_space.yaml`` with its
   default trial budget.
3. Both answers are then measured the same way: ``--repeats`` fresh DeepSpeed trials each through
   ``autotune.backends.DeepSpeedBackend``, alternating, at the fixed global batch (DeepSpeed's probes change
   the global batch; its pick is run with its ZeRO stage and micro-batch at the fixed batch).

DeepSpeed's autotuner needs ``tabulate`` (``pip install 'deepspeed[autotuning]'``, or ``pip install tabulate``
in the benchmark environment only); without it the script stops before measuring anything.

Usage:  python benchmarks/ds_autotuning.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.backends.deepspeed import DeepSpeedBackend  # noqa: E402
from autotune.catalog import load_model, make_cluster  # noqa: E402
from autotune.plan import ParallelPlan  # noqa: E402
from autotune.trials.request import TrialRequest  # noqa: E402

WORK = ROOT / "runs" / "ds_autotune"
RESULTS = ROOT / "benchmarks" / "results"
NPROC, GLOBAL_BATCH, SEQ_LEN, MODEL = 2, 4, 64, "tiny"
_STAGE = {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `deepspeed` on PATH
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    threads = str(max(1, (os.cpu_count() or 1) // NPROC))
    env |= {"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": str(NPROC), "OMP_NUM_THREADS": threads}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".torch_extensions"))
    return env


def run_deepspeed_autotuning() -> dict[str, Any]:
    work = WORK / "deepspeed"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    config = {
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": [0, 1, 2, 3]},
        "autotuning": {
            "enabled": True,
            "fast": True,
            "metric": "throughput",
            "start_profile_step": 3,
            "end_profile_step": 6,
            "max_train_batch_size": GLOBAL_BATCH,
            "min_train_micro_batch_size_per_gpu": 1,
            "max_train_micro_batch_size_per_gpu": GLOBAL_BATCH // NPROC,
            "exps_dir": str(work / "autotuning_exps"),
            "results_dir": str(work / "autotuning_results"),
        },
    }
    (work / "ds_config.json").write_text(json.dumps(config, indent=2))
    cmd = [
        "deepspeed",
        "--autotuning",
        "run",
        "--num_gpus",
        str(NPROC),
        str(ROOT / "benchmarks" / "_ds_autotune_train.py"),
        "--deepspeed_config",
        str(work / "ds_config.json"),
        "--model",
        MODEL,
        "--seq-len",
        str(SEQ_LEN),
    ]
    start = time.monotonic()
    with (work / "autotuner.log").open("w") as log:
        proc = subprocess.run(
            cmd, cwd=work, env=_env(), stdout=log, stderr=subprocess.STDOUT, timeout=1800, check=False
        )
    wall = time.monotonic() - start
    optimal = work / "autotuning_results" / "ds_config_optimal.json"
    exps = sorted(p.name for p in (work / "autotuning_exps").glob("*.json"))
    out: dict[str, Any] = {
        "wall_s": wall,
        "exit_code": proc.returncode,
        "experiments": len(exps),
        "experiment_names": exps,
        "answer": None,
    }
    if optimal.exists():  # exit 0 even when every experiment failed: the file is the only proof
        ds = json.loads(optimal.read_text())
        stage = int(ds.get("zero_optimization", {}).get("stage", 0))
        out["answer"] = {
            "zero_stage": stage,
            "micro_batch": int(ds["train_micro_batch_size_per_gpu"]),
            "gradient_accumulation_steps": int(ds.get("gradient_accumulation_steps", 1)),
            "train_batch_size": ds.get("train_batch_size"),
        }
    return out


def run_autotune() -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        MODEL,
        "--gpus",
        str(NPROC),
        "--gpu",
        "cpu",
        "--device",
        "cpu",
        "--backend",
        "deepspeed",
        "--space",
        str(ROOT / "benchmarks" / "data" / "ds_covered_space.yaml"),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--seq-len",
        str(SEQ_LEN),
        "--out",
        str(WORK),
        "--study",
        "autotune",
        "--force",
        "--json",
    ]
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800, check=False
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        return {"wall_s": wall, "exit_code": proc.returncode, "error": proc.stderr[-2000:], "answer": None}
    summary = json.loads(proc.stdout)
    plan = summary["plan"]
    return {
        "wall_s": wall,
        "exit_code": 0,
        "trials": summary["trials"],
        "calibration": summary.get("calibration"),
        "answer": {
            "zero_stage": {v: k for k, v in _STAGE.items()}[plan["sharding"]],
            "micro_batch": plan["micro_batch"],
        },
    }


def _plan(answer: dict[str, Any]) -> ParallelPlan:
    return ParallelPlan(
        dp=NPROC,
        micro_batch=answer["micro_batch"],
        global_batch=GLOBAL_BATCH,
        seq_len=SEQ_LEN,
        sharding=_STAGE[answer["zero_stage"]],
        framework="deepspeed",
    )


def measure(answers: dict[str, dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Fresh trials of each answer, alternating, so load drift hits both alike."""
    backend = DeepSpeedBackend(device="cpu")
    model, cluster = load_model(MODEL), make_cluster(num_gpus=NPROC, gpu="cpu")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in answers}
    for rep in range(repeats):
        for name, answer in answers.items():
            request = TrialRequest(
                model=model,
                cluster=cluster,
                plan=_plan(answer),
                timeout_s=300,
                trial_dir=WORK / "measure" / f"{name}-{rep}",
                measure_steps=10,
            )
            result = backend.run(request)
            runs[name].append(
                {
                    "status": str(result.status),
                    "tokens_per_s": result.tokens_per_s,
                    "step_time_s": result.step_time_s,
                    "load_avg": list(os.getloadavg()),
                }
            )
    return {
        name: {
            "runs": r,
            "median_tokens_per_s": statistics.median(x["tokens_per_s"] for x in r if x["tokens_per_s"])
            if any(x["tokens_per_s"] for x in r)
            else None,
        }
        for name, r in runs.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if importlib.util.find_spec("tabulate") is None:  # deepspeed --autotuning asserts on it and exits 1
        sys.exit(
            "ds_autotuning.py: DeepSpeed Autotuning needs `tabulate`; run `pip install tabulate` "
            "(deepspeed[autotuning]) and rerun; benchmarks/results/ds_autotuning.json is unchanged"
        )
    WORK.mkdir(parents=True, exist_ok=True)
    load_before = list(os.getloadavg())
    ds = run_deepspeed_autotuning()
    ours = run_autotune()
    answers = {k: v["answer"] for k, v in (("deepspeed", ds), ("autotune", ours)) if v["answer"]}
    measured = measure(answers, args.repeats) if answers else {}
    out = {
        "model": MODEL,
        "nproc": NPROC,
        "global_batch": GLOBAL_BATCH,
        "seq_len": SEQ_LEN,
        "deepspeed": ds,
        "autotune": ours,
        "measured": measured,
        "load_before": load_before,
        "load_after": list(os.getloadavg()),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (RESULTS / "ds_autotuning.json").write_text(json.dumps(out, indent=2) + "\n")
    for name in ("deepspeed", "autotune"):
        m = measured.get(name, {})
        print(
            f"{name}: answer {out[name]['answer']} in {out[name]['wall_s']:.0f} s; measured "
            f"{m.get('median_tokens_per_s')} tokens/s"
        )


if __name__ == "__main__":
    main()
