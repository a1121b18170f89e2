"""Flags shared by subcommands: the model, the cluster, and the plan knobs (kebab-case)."""

from __future__ import annotations

import argparse
from typing import Any, cast

from autotune.batch import DEFAULT_GLOBAL_BATCH_TOKENS, default_global_batch
from autotune.catalog import load_model, make_cluster
from autotune.clusterfile import load_cluster
from autotune.errors import ConfigError
from autotune.plan import (
    FRAMEWORK_SHARDING,
    CpComm,
    Fp8Recipe,
    Framework,
    GradDtype,
    LossKernel,
    MoeDispatcher,
    ParallelPlan,
    Precision,
    Recompute,
    Schedule,
    Sharding,
    StoreDtype,
)
from autotune.probe.profile import with_profile
from autotune.specs import ClusterSpec, ModelSpec
from autotune.usergpu import load_gpu_spec

__all__ = [
    "add_model_cluster_args",
    "resolve_model_cluster",
    "add_plan_args",
    "positive_float",
    "plan_from_args",
    "default_seq_len",
    "default_global_batch",
    "DEFAULT_GLOBAL_BATCH_TOKENS",
    "DEFAULT_GPU",
    "implied_framework",
    "store_dtypes",
]

DEFAULT_GPU = "h100-sxm"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str, what: str = "a positive number") -> float:
    """argparse ``type``: a number above 0 (NaN and non-numbers rejected), ``what`` naming it in the error."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def add_model_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and cluster")
    g.add_argument(
        "--model",
        required=True,
        help="preset (7b, 70b, llama3-8b, ...: autotune models lists them) or a config.json/YAML path",
    )
    g.add_argument("--gpus", type=_positive_int, help="total GPUs (with --gpu and --gpus-per-node)")
    g.add_argument("--gpu", help=f"GPU type from the catalog (default: {DEFAULT_GPU}; cpu with --device cpu)")
    g.add_argument("--gpus-per-node", type=_positive_int, help="GPUs per node (default: the GPU's usual 8)")
    g.add_argument("--cluster", metavar="FILE", help="cluster YAML (gpu, num_nodes, gpus_per_node, links)")
    g.add_argument(
        "--inter-node", metavar="LINK", help="inter-node NIC type: ib-200, ib-400, 100gbe, 1gbe, ..."
    )
    g.add_argument(
        "--intra-node", metavar="LINK", help="intra-node link: nvlink3, nvlink4, pcie4, pcie5, ..."
    )
    g.add_argument("--nics-per-node", type=_positive_int, help="NICs per node (default: the GPU's usual)")
    g.add_argument("--host-memory-gib", type=float, help="host RAM per node for offload (default 1024)")
    g.add_argument(
        "--profile",
        metavar="FILE",
        help="hardware profile from `autotune probe` (or a study's "
        "calibration.yaml): its measured numbers replace the catalog's",
    )
    g.add_argument(
        "--gpu-spec",
        metavar="FILE",
        help="a GPU you describe (YAML: memory_gib, bf16_tflops, "
        "memory_bandwidth_gb_s, ... or base: <catalog GPU> plus what differs); replaces --gpu",
    )


def resolve_model_cluster(args: argparse.Namespace) -> tuple[ModelSpec, ClusterSpec]:
    model = load_model(args.model)
    if args.cluster:
        if args.gpus is not None or args.gpus_per_node is not None:
            raise ConfigError("--cluster describes the GPUs already; drop --gpus/--gpus-per-node")
        if getattr(args, "gpu_spec", None):
            raise ConfigError(
                "--gpu-spec with --cluster: describe the GPU inline under the cluster YAML's "
                "'gpu:' key instead"
            )
        cluster = load_cluster(args.cluster)
    else:
        if args.gpus is None:
            raise ConfigError("--gpus is required (or --cluster FILE)")
        cluster = cluster_from_flags(args, args.gpus)
    if getattr(args, "profile", None):
        cluster = with_profile(cluster, args.profile)
    return model, cluster


def cluster_from_flags(args: argparse.Namespace, num_gpus: int) -> ClusterSpec:
    """``num_gpus`` of ``--gpu`` with the node and link flags (``--gpus-per-node``, ``--intra-node``, ...)."""
    gpu_spec = getattr(args, "gpu_spec", None)
    return make_cluster(
        num_gpus=num_gpus,
        gpu=load_gpu_spec(gpu_spec) if gpu_spec else (args.gpu or DEFAULT_GPU),
        gpus_per_node=args.gpus_per_node,
        intra_node=args.intra_node,
        inter_node=args.inter_node,
        nics_per_node=args.nics_per_node,
        host_memory_gib=args.host_memory_gib,
    )


def add_plan_args(p: argparse.ArgumentParser, *, pinning: bool = False) -> None:
    """Plan knobs. With ``pinning`` (search) every knob defaults to None = free for the tuner."""
    d: dict[str, Any] = (
        {}
        if pinning
        else {
            "tp": 1,
            "pp": 1,
            "cp": 1,
            "micro_batch": 1,
            "sharding": "none",
            "recompute": "none",
            "schedule": None,
            "virtual_stages": None,  # 1, or 2 with --schedule zbv (its V holds two chunks per rank)
            "precision": "bf16",
            "ep": 1,
            "etp": 1,
            "fp8_recipe": "tensorwise",
        }
    )
    g = p.add_argument_group("plan" + (" (pin a knob; the rest stay free)" if pinning else ""))
    g.add_argument("--tp", type=_positive_int, default=d.get("tp"), help="tensor-parallel degree")
    g.add_argument("--pp", type=_positive_int, default=d.get("pp"), help="pipeline-parallel degree")
    g.add_argument("--dp", type=_positive_int, help="data-parallel degree (default: GPUs / (TP*PP*CP))")
    g.add_argument("--cp", type=_positive_int, default=d.get("cp"), help="context-parallel degree")
    g.add_argument(
        "--micro-batch", type=_positive_int, default=d.get("micro_batch"), help="sequences per micro-batch"
    )
    g.add_argument(
        "--global-batch",
        type=_positive_int,
        help="sequences per optimizer step (yours; never tuned). Default: ~4M tokens",
    )
    g.add_argument(
        "--seq-len", type=_positive_int, help="tokens per sequence (default: min(model max, 8192))"
    )
    g.add_argument("--sharding", choices=[s.value for s in Sharding], default=d.get("sharding"))
    g.add_argument("--hsdp-shard-size", type=_positive_int, help="ranks per HSDP shard group")
    g.add_argument("--recompute", choices=[r.value for r in Recompute], default=d.get("recompute"))
    g.add_argument("--sequence-parallel", action="store_true", default=None if pinning else False)
    g.add_argument("--schedule", choices=[s.value for s in Schedule], default=d.get("schedule"))
    g.add_argument("--virtual-stages", type=_positive_int, default=d.get("virtual_stages"))
    g.add_argument(
        "--offload",
        action="store_true",
        default=None if pinning else False,
        help="optimizer states on the host",
    )
    g.add_argument("--precision", choices=[x.value for x in Precision], default=d.get("precision"))
    g.add_argument("--framework", choices=[f.value for f in Framework], default=d.get("framework"))
    g.add_argument(
        "--ep",
        type=_positive_int,
        default=d.get("ep"),
        help="expert-parallel degree (MoE models; folds into TP x DP x CP)",
    )
    g.add_argument(
        "--etp", type=_positive_int, default=d.get("etp"), help="expert tensor-parallel degree (MoE models)"
    )
    if not pinning:
        g.add_argument(
            "--recompute-layers",
            type=_positive_int,
            metavar="N",
            help="with --recompute full (megatron): recompute only the first N blocks of each "
            "model chunk (--recompute-method block)",
        )
    g.add_argument(
        "--fp8-recipe",
        choices=[r.value for r in Fp8Recipe],
        default=d.get("fp8_recipe"),
        help="fp8 scaling (with --precision fp8)",
    )
    for flag, what in (
        ("--compile", "torch.compile the model (fsdp framework)"),
        ("--async-tp", "torch async tensor parallelism (fsdp framework, needs --compile)"),
        ("--tp-comm-overlap", "Megatron/TE TP comm overlap (needs --sequence-parallel)"),
        (
            "--moe-a2a-overlap",
            "Megatron's EP all-to-all overlap (--overlap-moe-expert-parallel-comm --delay-wgrad-compute; "
            "EP > 1, interleaved schedule when PP > 1)",
        ),
    ):
        g.add_argument(flag, action="store_true", default=None if pinning else False, help=what)
    g.add_argument(
        "--cp-comm",
        choices=[c.value for c in CpComm],
        default=d.get("cp_comm"),
        help="context-parallel exchange (with --cp > 1; default p2p, and a2a = Ulysses under --framework "
        "deepspeed, its only one)",
    )
    g.add_argument(
        "--moe-capacity-factor",
        type=positive_float,
        metavar="C",
        help="MoE token dropping (yours; never tuned): each expert takes at most C x its balanced share of "
        "token copies, padded to that (Megatron --moe-expert-capacity-factor C "
        "--moe-pad-expert-input-to-capacity; DeepSpeed-MoE capacity_factor). Default: dropless",
    )
    g.add_argument(
        "--moe-load-imbalance",
        type=positive_float,
        metavar="X",
        help="routed tokens of the busiest EP rank over the mean, as you measured your router (>= 1; yours, "
        "never tuned). Default 1: balanced, as framework benchmarks force it",
    )
    for flag, kind, default, what in (  # yours (they change convergence), never tuned
        ("--weight-dtype", StoreDtype, "fp32", "parameters and sharded gradients (bf16: no fp32 master)"),
        (
            "--adam-dtype",
            StoreDtype,
            None,
            "Adam's moments (default: the weights'); megatron: bf16 with --precision-aware-optimizer",
        ),
        (
            "--loss-kernel",
            LossKernel,
            "fp32",
            "cross-entropy: eager fp32 or bf16, fused, chunked (Liger); megatron: fused (TE's)",
        ),
    ):
        g.add_argument(flag, choices=[x.value for x in kind], default=default, help=f"fsdp: {what}")
    g.add_argument(  # yours too: on every plan of a search, which keeps only Megatron plans then
        "--precision-aware-optimizer",
        action="store_true",
        default=False,
        help="megatron: 16-bit fp32-master remainders (--use-precision-aware-optimizer; with its "
        "distributed optimizer)",
    )
    g.add_argument(
        "--grad-reduce-dtype",
        choices=[x.value for x in GradDtype],
        default=None,
        help="megatron: gradient buffer / DP reduction dtype (bf16: --grad-reduce-in-bf16); "
        "default fp32, bf16 with --precision fp8",
    )
    if not pinning:
        g.add_argument(
            "--moe-dispatcher",
            choices=[m.value for m in MoeDispatcher],
            default="alltoall",
            help="MoE token dispatch (with --ep > 1): Megatron's all-to-all, or its flex "
            "dispatcher with DeepEP / HybridEP (one copy per destination node across nodes)",
        )
        g.add_argument(
            "--recompute-modules",
            nargs="+",
            metavar="MODULE",
            help="with --recompute selective (megatron): Megatron's --recompute-modules "
            "(core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts)",
        )
        g.add_argument(
            "--offload-modules",
            nargs="+",
            metavar="MODULE",
            help="megatron MoE: the inputs these expert modules save go to host memory "
            "(--fine-grained-activation-offloading --offload-modules; priced: expert_fc1, moe_act)",
        )
        g.add_argument(
            "--offload-activation-layers",
            type=_positive_int,
            metavar="N",
            help="megatron: activations of N layers to host memory (--cpu-offloading-num-layers)",
        )


def default_seq_len(model: ModelSpec) -> int:
    return min(model.max_seq_len, 8192)


def plan_from_args(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec) -> ParallelPlan:
    """The fully pinned plan of ``autotune estimate``; DP defaults to what the GPUs leave."""
    for flag in ("ep", "etp"):  # before the plan's own rules, which would name a framework's EP fold
        if getattr(args, flag) > 1 and not model.is_moe:
            raise ConfigError(
                f"--{flag} {getattr(args, flag)}: {model.name} is a dense model (no routed experts); "
                "expert parallelism needs an MoE model"
            )
    seq_len = args.seq_len or default_seq_len(model)
    model_parallel = args.tp * args.pp * args.cp
    if args.dp is None:
        if cluster.num_gpus % model_parallel:
            raise ConfigError(
                f"--tp x --pp x --cp = {model_parallel} does not divide --gpus {cluster.num_gpus}"
            )
        dp = cluster.num_gpus // model_parallel
    else:
        dp = args.dp
    global_batch = args.global_batch or default_global_batch(seq_len, dp * args.micro_batch)
    schedule = args.schedule or ("interleaved" if (args.virtual_stages or 1) > 1 else "1f1b")
    virtual_stages = args.virtual_stages or (2 if schedule == Schedule.ZBV.value else 1)
    framework = args.framework or implied_framework(args.sharding) or "fsdp"
    return ParallelPlan(
        tp=args.tp,
        pp=args.pp,
        dp=dp,
        cp=args.cp,
        micro_batch=args.micro_batch,
        global_batch=global_batch,
        seq_len=seq_len,
        sharding=args.sharding,
        hsdp_shard_size=args.hsdp_shard_size,
        recompute=args.recompute,
        sequence_parallel=args.sequence_parallel,
        schedule=cast(Schedule, schedule),  # ParallelPlan takes the enum's value (and names a bad one)
        virtual_stages=virtual_stages,
        offload=args.offload,
        precision=args.precision,
        framework=cast(Framework, framework),
        ep=args.ep,
        etp=args.etp,
        recompute_layers=getattr(args, "recompute_layers", None),
        fp8_recipe=args.fp8_recipe,
        compile=args.compile,
        async_tp=args.async_tp,
        tp_comm_overlap=args.tp_comm_overlap,
        moe_a2a_overlap=bool(getattr(args, "moe_a2a_overlap", False)),
        cp_comm=cast(CpComm, args.cp_comm or ("a2a" if framework == "deepspeed" and args.cp > 1 else "p2p")),
        moe_dispatcher=cast(MoeDispatcher, getattr(args, "moe_dispatcher", "alltoall")),
        recompute_modules=tuple(getattr(args, "recompute_modules", None) or ()),
        offload_activation_layers=getattr(args, "offload_activation_layers", None) or 0,
        offload_modules=tuple(getattr(args, "offload_modules", None) or ()),
        **store_dtypes(args),
        moe_capacity_factor=getattr(args, "moe_capacity_factor", None),
        moe_load_imbalance=getattr(args, "moe_load_imbalance", None) or 1.0,
    )


def store_dtypes(args: argparse.Namespace) -> dict[str, Any]:
    """The plan's stored dtypes and Megatron optimizer the user gave (``--weight-dtype``, ``--adam-dtype``,
    ``--loss-kernel``, ``--precision-aware-optimizer``, ``--grad-reduce-dtype``): numerics, never tuned."""
    return {
        "weight_dtype": getattr(args, "weight_dtype", None) or "fp32",
        "adam_dtype": getattr(args, "adam_dtype", None),
        "loss_kernel": getattr(args, "loss_kernel", None) or "fp32",
        "precision_aware_optimizer": bool(getattr(args, "precision_aware_optimizer", False)),
        "grad_reduce_dtype": getattr(args, "grad_reduce_dtype", None),
    }


def implied_framework(sharding: str | None) -> str | None:
    """The one framework that offers ``sharding`` (zero2/zero3: DeepSpeed); None when several or none do."""
    offering = [fw for fw, shardings in FRAMEWORK_SHARDING.items() if sharding in shardings]
    return str(offering[0]) if sharding is not None and len(offering) == 1 else None
