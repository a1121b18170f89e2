"""``autotune probe``: measure this machine and write a hardware profile for ``--profile``.

Examples::

    autotune probe --device cpu --nproc 2                 # gloo, 2 ranks: runs/profiles/cpu-2rank.yaml
    autotune probe --device cuda --name h200-node          # NCCL over the node's GPUs
    torchrun --nnodes 2 --nproc-per-node 8 ... -m autotune probe --device cuda   # in-node and between nodes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autotune.catalog import load_gpu
from autotune.errors import ConfigError
from autotune.trials.cpu import cpu_share
from autotune.userfile import writable_dir

__all__ = ["ProbeCommand", "parse_size"]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_GPU_NAMES = (
    (("GH200",), None),  # a Grace Hopper superchip contains "H200" but is not one: refused with the fix
    (("H800",), "h800"),
    (("H200",), "h200"),
    (("H100", "PCIE"), "h100-pcie"),
    (("H100",), "h100-sxm"),
    (("A100", "80GB"), "a100-80gb"),
    (("A100",), "a100-40gb"),
    (("GB300",), "gb300"),  # before B300 / B200: "NVIDIA GB200" contains "B200"
    (("GB200",), "gb200"),
    (("B300",), "b300"),
    (("B200",), "b200"),
    (("L40S",), "l40s"),
    (("A10G",), "a10g"),
    (("4090",), "rtx-4090"),
    (("MI300X",), "mi300x"),
    (("V100",), "v100"),
)


def parse_size(text: str) -> int:
    """``1K``, ``256M``, ``1G`` or a byte count."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = int(float(t[: len(t) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 1K, 256M or 1G, got {text!r}") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"expected at least 4 bytes, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count of at least 1 (``--sweeps``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {text!r}")
    return value


def _guess_gpu(device_name: str) -> str:
    upper = device_name.upper()
    for needles, key in _GPU_NAMES:
        if all(n in upper for n in needles):
            if key is None:
                break
            return key
    raise ConfigError(f"cannot tell which catalog GPU {device_name!r} is; pass --gpu KEY")


_RAW = ".probe-raw.json"


class ProbeCommand:
    help = "Measure GEMMs and collectives on this machine; write a hardware profile for --profile."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--device", choices=("cpu", "cuda"), help="cuda (NCCL) when GPUs are present, else cpu (gloo)"
        )
        p.add_argument("--nproc", type=int, help="ranks on this node (default: 2 on cpu, every GPU on cuda)")
        p.add_argument("--name", help="profile name (default: <device>-<N>rank)")
        p.add_argument(
            "--gpu", help="catalog GPU the profile stands for (default: cpu, or from the device name)"
        )
        p.add_argument(
            "--out",
            default=str(Path("runs") / "profiles"),
            metavar="DIR",
            help="where <name>.yaml goes (default runs/profiles)",
        )
        p.add_argument("--min-size", type=parse_size, default=1024, help="smallest message (default 1K)")
        p.add_argument(
            "--max-size", type=parse_size, default=256 * 1024**2, help="largest message (default 256M)"
        )
        p.add_argument("--quick", action="store_true", help="fewer GEMM shapes (tests, smoke runs)")
        p.add_argument(
            "--sweeps",
            type=positive_int,
            default=3,
            metavar="N",
            help="collective sweeps, each size's median kept (default 3)",
        )
        p.add_argument("--timeout", type=float, default=900.0, metavar="S", help="give up after S seconds")
        p.add_argument("--json", action="store_true", help="print the profile as one JSON object")

    def run(self, args: argparse.Namespace) -> int:
        writable_dir(args.out, "--out")  # now, not after minutes of measuring
        device = args.device or _default_device()
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun (e.g. across nodes)
            from autotune.probe.worker import finish, run_probe

            raw = run_probe(
                device_type=device,
                min_bytes=args.min_size,
                max_bytes=args.max_size,
                quick=args.quick,
                sweeps=args.sweeps,
            )
            finish()
            if raw is None:  # not rank 0: rank 0 writes the profile
                return 0
        else:
            raw = _launch(args, device)
        return _write(args, raw)


def _default_device() -> str:
    from autotune.preflight import local_gpu_count

    return "cuda" if local_gpu_count() else "cpu"


def _launch(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Run the probe worker on ``--nproc`` local ranks under ``torchrun --standalone``."""
    if device == "cuda":
        from autotune.preflight import local_gpu_count

        have = local_gpu_count()
        if not have:
            raise ConfigError("--device cuda: no CUDA GPU on this node; use --device cpu")
        nproc = args.nproc or have
    else:
        nproc = args.nproc or 2
    if nproc < 1:
        raise ConfigError(f"--nproc must be positive, got {nproc}")
    out = Path(args.out) / _RAW  # kept in --out until the profile is written: a failure loses no measurement
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "autotune.probe.worker",
        "--out",
        str(out),
        "--device",
        device,
        "--min-bytes",
        str(args.min_size),
        "--max-bytes",
        str(args.max_size),
        "--sweeps",
        str(args.sweeps),
    ] + (["--quick"] * args.quick)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(cpu_share(len(os.sched_getaffinity(0)), nproc)[0]))  # as trials run
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ConfigError(f"the probe failed (torchrun exit {proc.returncode}): {tail}")
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the probe took longer than --timeout {args.timeout:g} s") from None


def _write(args: argparse.Namespace, raw: dict[str, Any]) -> int:
    from autotune.probe.fit import probe_profile
    from autotune.probe.profile import write_profile

    key = args.gpu or ("cpu" if raw["device"] == "cpu" else _guess_gpu(raw["device_name"]))
    gpu = load_gpu(key)
    nodes, local = raw["num_nodes"], raw["local_world_size"]
    name = args.name or (f"{raw['device']}-{local}rank" if nodes == 1 else f"{raw['device']}-{nodes}x{local}")
    profile = probe_profile(raw, name=name, gpu=gpu, nics_per_node=gpu.default_nics_per_node)
    try:
        path = write_profile(profile, Path(args.out) / f"{name}.yaml")
    except OSError as e:
        raise ConfigError(
            f"--out {args.out}: cannot write {name}.yaml ({e.strerror}); the raw measurements "
            f"are in {Path(args.out) / _RAW}"
        ) from None
    (Path(args.out) / _RAW).unlink(missing_ok=True)
    if args.json:
        print(json.dumps(profile | {"path": str(path)}, indent=2))
        return 0
    print(_report(profile, path))
    return 0


def _report(profile: dict[str, Any], path: Path) -> str:
    s, g = profile["summary"], profile["gpu_overrides"]
    lines = [
        f"profile   {profile['name']} ({profile['gpu']}), measured {profile['measured']}",
        f"source    {profile['source']}",
        "GEMM      best "
        + ", ".join(f"{k} {v:g} TFLOP/s" for k, v in s["best_gemm_tflops"].items())
        + f"; gemm_efficiency {g['gemm_efficiency']:.3f}",
        f"memory    copy {s['copy_gb_s']:g} GB/s",
    ]
    for scope in ("intra_node_link", "inter_node_link"):
        if scope in profile:
            link = profile[scope]
            lines.append(
                f"{scope.split('_')[0]:<9} alpha-beta fit: {link['bw_gb_s']:g} GB/s, "
                f"{link['latency_us']:g} us per ring step"
            )
    lines += ["peak busbw " + ", ".join(f"{k} {v:g} GB/s" for k, v in s["peak_busbw_gb_s"].items())]
    if s.get("sweep_spread"):
        lines.append(
            f"noise     {s['collective_sweeps']} sweeps, median kept; slowest - fastest sweep, "
            "median size: " + ", ".join(f"{k} {v:.0%}" for k, v in s["sweep_spread"].items())
        )
    if "op_overhead_us" in g:
        lines.append(
            f"host      {g['op_overhead_us']:g} us per eager operator"
            + (
                f", {g['dtensor_op_overhead_us']:g} us per DTensor operator"
                if "dtensor_op_overhead_us" in g
                else ""
            )
        )
    if "pipeline_action_us" in g:
        lines.append(
            "pipeline  "
            + ", ".join(f"{k} {v:g} us" for k, v in g["pipeline_action_us"].items())
            + " per schedule action"
        )
    lines += [
        f"wrote     {path}",
        f"use       autotune estimate|search ... --gpu {profile['gpu']} --profile {path}",
    ]
    return "\n".join(lines)
