"""A published MoE row (``moe: true`` in benchmarks/data/modern_runs.yaml) as autotune's model and plan.

The row's ``shape`` becomes a ModelSpec; its layout, and what its recipe sets (read from the row's notes and
recompute detail: dispatcher, ``--recompute-modules``, EP overlap, token drop, activation offload, the DP and
TP overlap switches), a ParallelPlan. What the recipe ran that a plan cannot express is listed, not priced
(``unpriced_knobs``). ``benchmarks/moe_runs.py`` prices the rows; ``memory_published.py`` checks their memory.
"""

from __future__ import annotations

import re
from typing import Any

from autotune.catalog import model_from_dict
from autotune.plan import OFFLOAD_MODULES, RECOMPUTE_MODULES, ParallelPlan
from benchmarks._fsdp_stacks import FSDP_STACKS, row_numerics
from benchmarks.modern_runs import FP8_RECIPES

_RECOMPUTE = {"none": "none", "selective": "selective", "full": "full", "op-sac": "selective"}
"""Row recompute modes as plan modes; torchtitan's per-op SAC is framework fsdp's selective recompute."""


def row_model(row: dict[str, Any]):
    shape = {k: v for k, v in row["shape"].items() if k != "shape_source"}
    return model_from_dict(shape, name=row["id"])


def row_plan(row: dict[str, Any]) -> ParallelPlan:
    """The row's layout as a plan: Megatron's recipe (dispatcher, recompute modules, token drop, EP overlap,
    offload, overlap knobs), or for an FSDP2 row (torchtitan, NeMo AutoModel) framework fsdp with its
    dispatcher, torch.compile, and its stored dtypes and loss kernel (``row["numerics"]``)."""
    vp = row.get("vp") or 1
    layout = {k: row[k] for k in ("tp", "pp", "cp", "dp", "ep", "micro_batch", "global_batch", "seq_len")}
    layout.update(
        sharding=row["sharding"],
        recompute=_RECOMPUTE[row["recompute"]],
        precision=row["precision"],
        schedule="interleaved" if vp > 1 else "1f1b",
        virtual_stages=vp,
    )
    if row["framework"] in FSDP_STACKS:
        dispatch = row.get("dispatcher") or "alltoall"
        compiled = bool((row.get("knobs") or {}).get("compile"))
        return ParallelPlan(
            **layout, framework="fsdp", moe_dispatcher=dispatch, compile=compiled, **row_numerics(row)
        )
    return ParallelPlan(
        **layout,
        etp=row.get("etp") or 1,
        fp8_recipe=FP8_RECIPES.get(row.get("fp8_recipe"), row.get("fp8_recipe")),
        sequence_parallel=row["tp"] > 1,
        framework="megatron",
        moe_dispatcher=dispatcher(row),
        recompute_modules=recompute_modules(row),
        grad_reduce_dtype=row.get("grad_reduce_dtype"),
        moe_capacity_factor=TOKEN_DROP_CAPACITY if token_drop(row) else None,
        moe_a2a_overlap=a2a_overlap(row),
        offload_modules=offload_modules(row),
        loss_kernel="fused" if row.get("cross_entropy") == "te" else "fp32",  # TE's (data README)
        **optimizer_fields(row),
        **overlap_knobs(row),
    )


def overlap_knobs(row: dict[str, Any]) -> dict[str, bool]:
    """The Megatron overlap switches the row's recipe sets (its ``knobs``, read from the release's code:
    docs/moe.md), as plan fields: ``--overlap-grad-reduce``, ``--overlap-param-gather`` and TE's
    ``--tp-comm-overlap`` (only with TP > 1, where it exists). A knob the row leaves null keeps the plan's
    default (both DP overlaps on, TP-comm overlap off), as ``modern_runs.py`` does for the dense rows."""
    knobs = {k: bool(v) for k, v in (row.get("knobs") or {}).items() if v is not None}
    out = {k: knobs[k] for k in ("overlap_grad_reduce", "overlap_param_gather") if k in knobs}
    if row["tp"] > 1 and "tp_comm_overlap" in knobs:
        out["tp_comm_overlap"] = knobs["tp_comm_overlap"]
    return out


TOKEN_DROP_CAPACITY = 1.0
"""A token-drop row's capacity factor, padded: Megatron-Bridge's ``apply_moe_token_drop`` defaults
(``megatron/bridge/training/utils/moe_token_drop.py``: ``moe_expert_capacity_factor=1.0``,
``moe_pad_expert_input_to_capacity=True``; NeMo 2.0's ``MegatronTokenDropCallback`` before it). The tables
print "tokendrop", not the factor."""


def token_drop(row: dict[str, Any]) -> bool:
    """The row ran Megatron's token dropping (its notes say so), not dropless routing."""
    return "Token-DROP" in f"{row.get('notes', '')} {row.get('recompute_detail', '')}"


def a2a_overlap(row: dict[str, Any]) -> bool:
    """The row ran Megatron's EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``): its recipe sets
    it (``_recipe_knobs``) or its notes say so (the model zoo's "EP A2A overlap" column)."""
    return "EP a2a overlap" in _recipe_knobs(row) or "EP A2A overlap" in str(row.get("notes", ""))


def offload_modules(row: dict[str, Any]) -> tuple[str, ...]:
    """Megatron's ``--offload-modules`` of a row whose recipe turns on fine-grained activation offloading (its
    recompute detail, notes or recipe command), as ``plan.offload_modules``; () when it does not, or when it
    lists a module autotune does not price (the row then keeps "activation offload" among its unpriced
    knobs)."""
    text = f"{row.get('recompute_detail', '')} {row.get('notes', '')} {row.get('recipe_source', '')}"
    if "fine_grained_activation_offloading': True" not in text and "--fine-grained-activation" not in text:
        return ()
    found = [w for m in _OFFLOAD_MODULES.finditer(text) for w in re.findall(r"\w+", m.group(1))]
    mods = tuple(dict.fromkeys(found))
    return mods if mods and set(mods) <= set(OFFLOAD_MODULES) else ()


_OFFLOAD_MODULES = re.compile(r"offload[_-]modules'?:? ?\[?([\w', ]+)\]?")


def recompute_modules(row: dict[str, Any]) -> tuple[str, ...]:
    """Megatron's ``--recompute-modules`` of a selective-recompute row (its recompute detail / notes), as
    ``plan.recompute_modules``; () for Megatron's default (``core_attn``) or other recompute modes."""
    if row["recompute"] != "selective":
        return ()
    text = f"{row.get('notes', '')} {row.get('recompute_detail', '')}".replace(
        "--recompute-modules", "recompute_modules"
    ).replace("recompute of layernorm and MoE activation", "recompute_modules: ['layernorm', 'moe_act']")
    found = [w for m in _RECOMPUTE_MODULES.finditer(text) for w in re.findall(r"\w+", m.group(1))]
    return tuple(dict.fromkeys(w for w in found if w in RECOMPUTE_MODULES))


def dispatcher(row: dict[str, Any]) -> str:
    """The row's MoE token dispatcher as a plan value: the all-to-all where its recipe sets
    ``moe_token_dispatcher_type`` to it (a flex backend named beside it is then unused), else the flex backend
    its recipe names (``moe_flex_dispatcher_backend``, or "dispatcher DeepEP" in the zoo notes), else the
    all-to-all."""
    notes = str(row.get("notes", ""))
    if "'moe_token_dispatcher_type': 'alltoall'" in notes:  # the builder's dispatcher: a flex backend unused
        return "alltoall"
    m = re.search(r"'moe_flex_dispatcher_backend': '?(\w+)", notes)
    if m and m.group(1) in ("deepep", "hybridep"):
        return m.group(1)
    return "deepep" if "dispatcher DeepEP" in notes else "alltoall"


_UNPRICED = {
    "recompute_modules": "recompute {}",
    "fine_grained_activation_offloading": "activation offload",
    "use_precision_aware_optimizer": "precision-aware optimizer",
    "fp8_param_gather": "fp8 param gather",
    "moe_a2a_overlap": "EP a2a overlap",  # a plan field: ``a2a_overlap``, not listed
    "overlap_moe_expert_parallel_comm": "EP a2a overlap",
    "cuda_graph_impl": "CUDA graphs",
    "moe_paged_stash": "paged stash",
    "delay_wgrad_compute": "delayed wgrad",
}
"""Recipe settings (row notes) that a ParallelPlan cannot express: what each row ran beyond its plan."""
_RECOMPUTE_MODULES = re.compile(r"recompute[_-]modules'?(?::|=)? ?\[?([\w', ]+)\]?")


def unpriced_knobs(row: dict[str, Any]) -> list[str]:
    """What a row's recipe ran beyond its plan: ``_recipe_knobs`` less the EP overlap and the delayed weight
    gradient it is priced with, a plan field (``a2a_overlap``)."""
    priced = {"EP a2a overlap", "delayed wgrad"} if a2a_overlap(row) else set()
    if offload_modules(row):  # a plan field (``offload_modules``)
        priced.add("activation offload")
    if optimizer_fields(row):  # plan fields (``precision_aware_optimizer``, ``adam_dtype``)
        priced.add("precision-aware optimizer")
    return [k for k in _recipe_knobs(row) if k not in priced]


def optimizer_fields(row: dict[str, Any]) -> dict[str, Any]:
    """Megatron's precision-aware optimizer and its Adam moments' dtype as the row's recipe sets them (its
    notes: the recipe's ``use_precision_aware_optimizer`` / ``exp_avg_dtype``; Megatron-Bridge's DeepSeek
    recipe, "bf16 main grads and Adam moments"; its ``set_post_overrides`` for a bf16 run); moments not
    stated are Megatron's fp32 default."""
    text = str(row.get("notes", ""))
    on = re.search(r"'use_precision_aware_optimizer': True|runs the precision-aware optimizer with", text)
    if not (on or row["precision"] == "bf16" and "turns on the precision-aware optimizer for bf16" in text):
        return {}
    bf16 = re.search(r"'exp_avg_dtype': 'bf16'|--exp-avg-dtype bf16|bf16 main grads and Adam moments", text)
    return {"precision_aware_optimizer": True, **({"adam_dtype": "bf16"} if bf16 else {})}


def _recipe_knobs(row: dict[str, Any]) -> list[str]:
    """The ``_UNPRICED`` settings a row's recipe uses (from its notes and recompute detail), and Megatron's
    ``--recompute-modules`` that ``plan.recompute_modules`` cannot express."""
    text = f"{row.get('notes', '')} {row.get('recompute_detail', '')}"
    out = []
    for key, label in _UNPRICED.items():
        m = re.search(rf"'{key}': '?([\w-]+)", text)
        if not m or m.group(1) in ("False", "None"):
            continue
        out.append(label.format(m.group(1)) if key != "recompute_modules" else "")
    text = text.replace("--recompute-modules", "recompute_modules").replace(
        "recompute of layernorm and MoE activation", "recompute_modules: ['layernorm', 'moe_act']"
    )
    modules = {w for m in _RECOMPUTE_MODULES.finditer(text) for w in re.findall(r"\w+", m.group(1))} - {
        "core_attn"
    }
    out = [x for x in out if x]
    if modules - set(RECOMPUTE_MODULES):  # the rest is plan.recompute_modules
        out.insert(0, "recompute " + "+".join(sorted(modules - set(RECOMPUTE_MODULES))))
    return sorted(set(out), key=out.index)
