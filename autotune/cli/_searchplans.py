"""``autotune search``, before any trial: the backend, every legal plan ranked by the cost model, the study.

Bad input raises here, before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from autotune.cli._args import cluster_from_flags, default_seq_len, store_dtypes
from autotune.costmodel import estimate
from autotune.errors import ConfigError
from autotune.headroom import DEFAULT_MEMORY_HEADROOM
from autotune.modelshape import trial_model_gap
from autotune.plan import Framework
from autotune.probe.profile import with_profile
from autotune.specs import ClusterSpec, ModelSpec

__all__ = ["CPU_SEQUENCES_PER_PROCESS", "check_search_study", "open_search_study", "choose_and_rank"]

_PIN_KEYS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "micro_batch",
    "sharding",
    "hsdp_shard_size",
    "recompute",
    "sequence_parallel",
    "schedule",
    "virtual_stages",
    "offload",
    "precision",
    "framework",
    "ep",
    "etp",
    "fp8_recipe",
    "compile",
    "async_tp",
    "tp_comm_overlap",
    "cp_comm",
    "moe_a2a_overlap",
)
CPU_SEQUENCES_PER_PROCESS = 4


def choose_and_rank(
    args: argparse.Namespace,
    model: ModelSpec,
    cluster: ClusterSpec,
    estimator: Any = estimate,
    on_ladder: Any = None,
) -> tuple[Any, Any]:
    """The backend, and every legal plan ranked by the cost model (bad input raises before any write);
    ``on_ladder`` hears of each judged ladder (``ranking.LadderJudged``: the progress bar)."""
    from autotune.backends.registry import apply_pins, get_backend, trial_options
    from autotune.ranking import plan_search
    from autotune.space import load_space

    space = load_space(args.space)
    options = trial_options(workload=args.workload, script=args.script)
    choice = get_backend(
        args.backend,
        cluster=cluster,
        device=args.device,
        options=options,
        executor=args.executor,
        model=model,
    )
    runnable = choice.frameworks is None or args.framework in (None, *choice.frameworks)  # else: plan_search
    preflight = getattr(choice.backend, "preflight", None)
    if preflight is not None and runnable:  # before anything is written: no CUDA, no launcher -> one line
        preflight(cluster)
    gap = trial_model_gap(model)
    if getattr(choice.backend, "measures", False) and not options and gap:
        raise ConfigError(
            f"--model {model.name}: the built-in trial model has no {gap}; plan with --backend "
            "simulate, or run your own model with --workload / --script"
        )
    if getattr(choice.backend, "measures", False) and not options and args.moe_capacity_factor is not None:
        raise ConfigError(
            "--moe-capacity-factor: the built-in trial MoE routes dropless; plan with --backend simulate, "
            "or run your own model (its own token dropping) with --workload / --script"
        )
    stored = store_dtypes(args)
    custom = {k: v for k, v in stored.items() if k in _STORE_FLAGS and v not in (None, "fp32")}
    if getattr(choice.backend, "measures", False) and custom and (options or args.device == "cpu"):
        where = "on your --workload (its own numerics)" if options else "in CPU trials (fp32)"
        raise ConfigError(
            f"--weight-dtype / --adam-dtype / --loss-kernel {'/'.join(custom.values())} cannot run {where}; "
            "plan with --backend simulate, or measure on GPUs with the built-in model"
        )
    megatron = [f"--{k.replace('_', '-')}" for k in _MEGATRON_FLAGS if stored[k]]
    if megatron and choice.frameworks is not None and Framework.MEGATRON not in choice.frameworks:
        raise ConfigError(
            f"{' / '.join(megatron)}: Megatron's optimizer, and --backend {args.backend} runs no Megatron "
            "plan; plan with --backend simulate"
        )
    global_batch = _given_global_batch(args, cluster)
    pins = apply_pins({k: getattr(args, k) for k in _PIN_KEYS}, choice)
    ranking = plan_search(
        space,
        model,
        cluster,
        pins=pins,
        global_batch=global_batch,
        seq_len=args.seq_len or default_seq_len(model),
        frameworks=choice.frameworks,
        cluster_at=_cluster_at(args, cluster),
        estimator=estimator,
        on_ladder=on_ladder,
        memory_headroom=getattr(args, "memory_headroom", DEFAULT_MEMORY_HEADROOM),
        routing={
            "moe_capacity_factor": getattr(args, "moe_capacity_factor", None),
            "moe_load_imbalance": getattr(args, "moe_load_imbalance", None) or 1.0,
        },
        stored=stored,
    )
    return choice, ranking


_STORE_FLAGS = ("weight_dtype", "adam_dtype", "loss_kernel")
_MEGATRON_FLAGS = ("precision_aware_optimizer", "grad_reduce_dtype")


def _given_global_batch(args: argparse.Namespace, cluster: ClusterSpec) -> int | None:
    """The global batch the user gave, or the CPU default; None: the ranking picks ~4M tokens."""
    if args.global_batch is None and args.device == "cpu":  # real CPU steps: ~4M tokens would take hours
        return CPU_SEQUENCES_PER_PROCESS * cluster.num_gpus
    return args.global_batch  # type: ignore[no-any-return]


def check_search_study(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec) -> None:
    """Refuse a study ``open_search_study`` would refuse (it exists without --resume/--force, or was made
    for another model, cluster, batch or sequence) before the plans are ranked, which takes minutes on a large
    cluster; a default batch and the space are known after ranking and checked when the study is opened."""
    from autotune.store import check_reusable

    given_batch = _given_global_batch(args, cluster)
    identity = _study_identity(model, cluster, given_batch, args.seq_len or default_seq_len(model))
    if given_batch is None:  # the default batch is known once the layouts are ranked
        del identity["global_batch"]
    check_reusable(
        name=_study_name(args, model, cluster),
        runs_dir=Path(args.out),
        storage=args.storage,
        identity=identity,
        resume=args.resume,
        force=args.force,
    )


def open_search_study(
    args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, ranking: Any
) -> tuple[Any, Any, str]:
    import optuna

    from autotune.search import make_sampler
    from autotune.store import open_study

    ctx = ranking.ctx
    identity = {**_study_identity(model, cluster, ctx.global_batch, ctx.seq_len), "space": ranking.choices}
    if ctx.moe_capacity_factor is not None or ctx.moe_load_imbalance != 1.0:  # another run: another study
        identity["routing"] = ctx.routing()
    if ctx.custom_numerics or ctx.megatron_optimizer:  # other numerics: another study
        identity["stored"] = ctx.stored_json()
    if getattr(args, "profile", None):  # a probe profile changes every prediction: part of the identity
        identity["profile"] = args.profile
    study, study_dir, url = open_study(
        name=_study_name(args, model, cluster),
        runs_dir=Path(args.out),
        storage=args.storage,
        identity=identity,
        resume=args.resume,
        force=args.force,
        sampler=make_sampler(args.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1),
        heartbeat_s=args.heartbeat,
    )
    study.sampler = make_sampler(args.seed, len(study.trials))  # a resumed study does not replay its start
    return study, study_dir, url


def _study_name(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec) -> str:
    from autotune.store import study_name_for

    return args.study if args.study is not None else study_name_for(model, cluster)  # type: ignore[no-any-return]


def _study_identity(
    model: ModelSpec, cluster: ClusterSpec, global_batch: int | None, seq_len: int
) -> dict[str, Any]:
    """What a study is for: another model, cluster, batch or sequence is another study."""
    return {
        "model": model.name,
        "num_params": model.num_params,
        "cluster": cluster.name,
        "num_gpus": cluster.num_gpus,
        "global_batch": global_batch,
        "seq_len": seq_len,
    }


def _cluster_at(args: argparse.Namespace, cluster: ClusterSpec) -> Any:
    """The same cluster with another GPU count: for "the smallest cluster that would fit"."""
    if args.cluster:

        def from_file(n: int) -> ClusterSpec:
            if n % cluster.gpus_per_node:
                raise ConfigError(f"{n} GPUs is not a whole number of nodes")
            return dataclasses.replace(cluster, num_nodes=n // cluster.gpus_per_node)

        return from_file

    def from_flags(n: int) -> ClusterSpec:
        bigger = cluster_from_flags(args, n)
        return with_profile(bigger, args.profile) if args.profile else bigger  # measured, as this one

    return from_flags
