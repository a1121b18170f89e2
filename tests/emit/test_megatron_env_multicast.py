"""The launch environment of a Megatron plan with TE comm+GEMM overlap on a GPU without CUDA multicast."""

import os
import subprocess

from autotune.catalog import load_gpu
from autotune.emit.launchers import contract_env
from autotune.emit.megatron import megatron_env
from autotune.plan import ParallelPlan


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(
        **(
            {
                "tp": 8,
                "pp": 1,
                "dp": 2,
                "micro_batch": 1,
                "global_batch": 64,
                "seq_len": 4096,
                "sharding": "zero1",
                "sequence_parallel": True,
                "framework": "megatron",
                "tp_comm_overlap": True,
            }
            | kw
        )
    )


def test_ub_skipmc_only_below_hopper_and_only_with_the_overlap():
    a100, h100 = load_gpu("a100-80gb"), load_gpu("h100-sxm")
    assert a100.compute_capability == 8.0 and h100.compute_capability == 9.0
    assert megatron_env(_plan(), a100) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "UB_SKIPMC": "1"}
    assert "UB_SKIPMC" not in megatron_env(_plan(), h100)
    assert "UB_SKIPMC" not in megatron_env(_plan(tp_comm_overlap=False), a100)
    assert "UB_SKIPMC" not in megatron_env(_plan())  # GPU not known: nothing assumed


def test_autotune_env_exports_it_and_the_caller_can_override(tmp_path):
    (tmp_path / "autotune_env.sh").write_text(contract_env(_plan(), {}, load_gpu("a100-80gb")))
    show = '. "$RUN_DIR/autotune_env.sh"; echo "${UB_SKIPMC-}"'
    env = {k: v for k, v in os.environ.items() if k != "UB_SKIPMC"}
    run = subprocess.run(
        ["bash", "-c", show],
        env={**env, "RUN_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "1"
    run = subprocess.run(
        ["bash", "-c", show],
        env={**env, "RUN_DIR": str(tmp_path), "UB_SKIPMC": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == "0"
