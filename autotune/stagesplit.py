"""How many transformer blocks each pipeline model chunk holds, as each framework cuts the model.

A plan has ``pp x v`` model chunks (``v`` virtual stages); chunk ``c`` runs on pipeline rank ``c % pp``
(looped placement), or, under the ZBV schedule, on rank ``c`` for ``c < pp`` and ``2 pp - 1 - c`` after
(the V placement: rank 0 holds the first and the last chunk). When ``pp x v`` divides the layer count
every framework cuts equal chunks (the first also holds the embedding, the last the final norm, the output
layer and the loss). When it does not, each framework has its own rule, and this module reproduces it so
that the cost model prices, and the emitters write, the same split:

- Megatron-LM (megatron/core/transformer/transformer_layer.py ``get_transformer_layer_offset``, checked in
  ``TransformerConfig.__post_init__``): ``--account-for-embedding-in-pipeline-split`` /
  ``--account-for-loss-in-pipeline-split`` count the embedding / the loss as one layer each, so
  ``L + 2`` (or ``L + 1``) must divide into ``pp x v`` chunks and the first / last chunk holds one block
  fewer (what Megatron-Bridge's Llama-3.1-405B recipe uses: 126 + 2 = 128 = 8 x 8 x 2); or
  ``--decoder-first-pipeline-num-layers F`` / ``--decoder-last-pipeline-num-layers K``: the other
  ``pp - 2`` ranks share ``L - F - K`` equally, each of ``F``, ``K`` and the middle ranks' share divisible
  by ``v``. The two mechanisms are exclusive. Where neither fits (DeepSeek-V3's 61 layers at PP 8 x VP 2,
  or PP 16 x VP 2), ``--pipeline-model-parallel-layout`` names the blocks of every chunk
  (megatron/core/transformer/pipeline_parallel_layer_layout.py ``PipelineParallelLayerLayout``: chunks
  separated by ``|``, ``E`` the embedding, ``t`` a block, ``L`` the loss; the virtual-stage count follows
  from the chunk count). autotune's layout weighs the embedding and the loss as one block each, like the
  account-for split, and gives the ``L + 2 mod pp v`` left-over blocks to the chunks after the first (what
  Megatron-Bridge's DeepSeek-V3 recipes do by hand: ``Et*4|(t*4|)*14tmL``, a light last chunk).
- torchtitan (torchtitan/distributed/pipeline_parallel.py ``generate_llm_fqn_per_model_part``): the
  embedding and the output each weigh one layer (``pipeline_parallel_first/last_stage_less_layers`` = 1),
  ``L + 2`` effective layers go to ``pp x v`` stages, the first ``(L + 2) mod (pp v)`` stages one more;
  any degree up to ``L + 2`` stages is accepted. The emitter writes the module names per chunk.
- DeepSpeed (deepspeed/runtime/utils.py ``partition_uniform``, ``partition_method="uniform"`` over the
  ``PipelineModule`` layer list, which autotune's trials build as embedding, ``L`` blocks, head:
  autotune/trials/deepspeed_engine.py): ``L + 2`` items in order, the first ``(L + 2) mod pp`` stages one
  more; the first stage's embedding and the last's head are items.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # plan.py imports this module for its legality check
    from autotune.plan import ParallelPlan

__all__ = [
    "StageSplit",
    "head_rank",
    "split_layers",
    "split_layers_of",
    "split_error",
    "pipeline_degree_ok",
    "UNIFORM",
    "ACCOUNT_BOTH",
    "ACCOUNT_LOSS",
    "FIRST_LAST",
    "LAYOUT",
    "TORCHTITAN",
    "DEEPSPEED",
    "megatron_layout",
]

UNIFORM = "uniform"
ACCOUNT_BOTH = "account-embedding-and-loss"
ACCOUNT_LOSS = "account-loss"
FIRST_LAST = "first-last"
LAYOUT = "layout"
TORCHTITAN = "torchtitan-weighted"
DEEPSPEED = "deepspeed-uniform"


@dataclass(frozen=True, kw_only=True, slots=True)
class StageSplit:
    """Blocks per model chunk, in stage order (chunk ``c`` on pipeline rank ``c % pp``, or in a V)."""

    pp: int
    chunk_layers: tuple[int, ...]
    method: str
    """Which framework rule made it (module constants); ``uniform`` when ``pp x v`` divides the layers."""
    mtp: int = 0
    """Multi-token prediction modules on the last chunk (Megatron's ``m`` in a layout)."""
    v_shape: bool = False
    """Two chunks per rank in a V (ZBV): rank ``r`` holds chunks ``r`` and ``2 pp - 1 - r``."""

    def rank_layers(self, rank: int) -> int:
        """Blocks pipeline rank ``rank`` holds over its ``v`` chunks."""
        if self.v_shape:
            return self.chunk_layers[rank] + self.chunk_layers[2 * self.pp - 1 - rank]
        return sum(self.chunk_layers[rank :: self.pp])

    @property
    def head_rank(self) -> int:
        """The rank of the last chunk (final norm, output layer, loss): the last rank, or the first in a V."""
        return 0 if self.v_shape else self.pp - 1

    def rank_blocks(self, rank: int) -> tuple[range, ...]:
        """The block indices of each chunk pipeline rank ``rank`` holds: chunks take the blocks in order."""
        starts = [0, *itertools.accumulate(self.chunk_layers)]
        pp = self.pp
        chunks = (rank, 2 * pp - 1 - rank) if self.v_shape else range(rank, len(self.chunk_layers), pp)
        return tuple(range(starts[c], starts[c + 1]) for c in chunks)

    def all_rank_layers(self) -> tuple[int, ...]:
        """``rank_layers`` of every rank, in rank order (remembered: a search asks for it per plan)."""
        return _all_rank_layers(self)

    @property
    def first_rank_layers(self) -> int:
        return self.rank_layers(0)

    @property
    def last_rank_layers(self) -> int:
        return self.rank_layers(self.pp - 1)

    @property
    def max_middle_layers(self) -> int:
        """Most blocks on a rank that holds neither end (0 when ``pp <= 2``)."""
        return max((self.rank_layers(r) for r in range(1, self.pp - 1)), default=0)

    @property
    def uniform(self) -> bool:
        return self.method == UNIFORM


def head_rank(plan: ParallelPlan) -> int:
    """The pipeline rank that holds the last chunk (``StageSplit.head_rank``) from the plan alone."""
    return 0 if plan.schedule.v_shape else plan.pp - 1


@functools.lru_cache(maxsize=1024)
def _all_rank_layers(split: StageSplit) -> tuple[int, ...]:
    return tuple(split.rank_layers(r) for r in range(split.pp))


def split_layers(num_layers: int, plan: ParallelPlan, *, mtp: int = 0) -> StageSplit:
    """The split ``plan.framework`` makes (module docstring); ``ValueError`` when it cannot split. ``mtp``:
    the model's multi-token prediction modules, which Megatron places on the last chunk."""
    return split_layers_of(
        num_layers, plan.pp, plan.virtual_stages, str(plan.framework), mtp, v_shape=plan.schedule.v_shape
    )


def split_layers_of(
    num_layers: int, pp: int, virtual_stages: int, framework: str, mtp: int = 0, *, v_shape: bool = False
) -> StageSplit:
    """``split_layers`` from the plan fields it reads; ``v_shape``: the chunks placed in a V (the cut is the
    same: torchtitan cuts the stages before it places them)."""
    split = _split(num_layers, pp, virtual_stages, framework, mtp)
    if isinstance(split, str):
        raise ValueError(split)
    return replace(split, v_shape=True) if v_shape and pp > 1 else split


def split_error(num_layers: int, pp: int, virtual_stages: int, framework: str, mtp: int = 0) -> str | None:
    """Why ``framework`` cannot cut ``num_layers`` blocks into ``pp x virtual_stages`` chunks; None when
    it can."""
    split = _split(num_layers, pp, virtual_stages, str(framework), mtp)
    return split if isinstance(split, str) else None


def pipeline_degree_ok(num_layers: int, pp: int) -> bool:
    """PP degrees worth offering by rule ``divisors_of_layers``: those that divide the layers, or the
    layers plus the embedding and the loss (Megatron's account-for split; torchtitan's weighted split), and
    powers of two up to half the layers, which every framework splits unevenly (Megatron's first/last or
    layout split, torchtitan's weighted one, DeepSpeed's uniform one): DeepSeek-V3's 61 layers run at PP 8
    and 16 (Megatron-Bridge recipes)."""
    power_of_two = pp & (pp - 1) == 0 and 2 * pp <= num_layers
    return num_layers % pp == 0 or (num_layers + 2) % pp == 0 or power_of_two


@functools.lru_cache(maxsize=4096)
def _split(num_layers: int, pp: int, v: int, framework: str, mtp: int = 0) -> StageSplit | str:
    chunks = pp * v
    if num_layers % chunks == 0:
        return StageSplit(pp=pp, chunk_layers=(num_layers // chunks,) * chunks, method=UNIFORM, mtp=mtp)
    if framework == "megatron":
        return _megatron(num_layers, pp, v, mtp)
    if framework == "fsdp":
        return _torchtitan(num_layers, pp, v)
    return _deepspeed(num_layers, pp, v)


def _megatron(num_layers: int, pp: int, v: int, mtp: int = 0) -> StageSplit | str:
    """Account-for split if ``L + 2`` / ``L + 1`` divides, else the first/last-layers split whose busiest
    rank holds the fewest blocks (ties: the smaller last stage, which also runs the head), else a layout.
    With multi-token prediction (``mtp`` modules) only the layout, which places them (``m``) in the last
    chunk before the loss (``_megatron_layout_split``)."""
    chunks = pp * v
    if mtp:
        return _megatron_layout_split(num_layers, pp, v, mtp)
    for extra, method in ((2, ACCOUNT_BOTH), (1, ACCOUNT_LOSS)):
        if (num_layers + extra) % chunks == 0 and (num_layers + extra) // chunks >= 2:
            per = [(num_layers + extra) // chunks] * chunks
            per[-1] -= 1
            if extra == 2:
                per[0] -= 1
            return StageSplit(pp=pp, chunk_layers=tuple(per), method=method)
    best: tuple[tuple[int, int], StageSplit] | None = None
    for first in range(v, num_layers + 1, v):
        for last in range(v, num_layers - first + 1, v):
            middle = num_layers - first - last
            if (pp == 2 and middle) or (pp > 2 and (middle == 0 or middle % ((pp - 2) * v))):
                continue
            mid = middle // ((pp - 2) * v) if pp > 2 else 0
            per = [first // v] + [mid] * (pp - 2) + [last // v]
            split = StageSplit(pp=pp, chunk_layers=tuple(per) * v, method=FIRST_LAST)
            key = (max(first, last, mid * v), last)
            if best is None or key < best[0]:
                best = (key, split)
    if best is not None:
        return best[1]
    return _megatron_layout_split(num_layers, pp, v, 0)


def _megatron_layout_split(num_layers: int, pp: int, v: int, mtp: int) -> StageSplit | str:
    """The layout split (module docstring). With multi-token prediction the weights follow the recipes'
    DeepSeek-V3 layouts: the loss a block, each MTP module two (its block and its head pass), the embedding
    lookup nothing; left-over blocks go to the first chunks and a last chunk short of blocks takes them from
    the first ones. That reproduces Megatron-Bridge's and NVIDIA's MLPerf ``Et*4|(t*4|)*14tmL`` (PP x VP =
    16) and Megatron-Bridge's H100 ``Et|(tt|)*30mL`` (32 chunks)."""
    chunks = pp * v
    if mtp:
        even, extra = divmod(num_layers + 1 + 2 * mtp, chunks)
        layers = [even + (i < extra) for i in range(chunks)]
        layers[-1] -= 1 + 2 * mtp
        short, layers[-1] = max(0, -layers[-1]), max(0, layers[-1])
        for i in range(chunks - 1):
            take = min(short, layers[i])
            layers[i], short = layers[i] - take, short - take
        if short or even < 1:
            return (
                f"Megatron cannot split {num_layers} layers + MTP into PP x virtual stages = {pp} x {v}: "
                "more chunks than blocks"
            )
        return StageSplit(pp=pp, chunk_layers=tuple(layers), method=LAYOUT, mtp=mtp)
    even, extra = divmod(num_layers + 2, chunks)
    if even < 1:  # an end chunk may hold the embedding or the loss alone (Megatron's "...|L" example)
        return (
            f"Megatron cannot split {num_layers} layers into PP x virtual stages = {pp} x {v}: more "
            "chunks than blocks + embedding + loss"
        )
    layers = [even + (0 < i <= extra) for i in range(chunks)]  # left-over blocks after the first chunk
    layers[0] -= 1
    layers[-1] -= 1
    return StageSplit(pp=pp, chunk_layers=tuple(layers), method=LAYOUT)


def megatron_layout(split: StageSplit) -> str:
    """``--pipeline-model-parallel-layout`` of ``split``: its chunks in stage order (module docstring)."""
    last = len(split.chunk_layers) - 1
    return "|".join(
        ("E" if i == 0 else "") + "t" * n + ("m" * split.mtp + "L" if i == last else "")
        for i, n in enumerate(split.chunk_layers)
    )


def _torchtitan(num_layers: int, pp: int, v: int) -> StageSplit | str:
    chunks = pp * v
    effective = num_layers + 2
    per, extra = divmod(effective, chunks)
    if per < 1:
        return f"torchtitan cannot cut {num_layers} layers + embedding + output into {chunks} stages"
    layers = [per + (i < extra) for i in range(chunks)]
    layers[0] -= 1
    layers[-1] -= 1
    return StageSplit(pp=pp, chunk_layers=tuple(layers), method=TORCHTITAN)


def _deepspeed(num_layers: int, pp: int, v: int) -> StageSplit | str:
    items = num_layers + 2  # embedding, blocks, head
    per, extra = divmod(items, pp)
    if v != 1 or per < 1:
        return f"DeepSpeed cannot split {num_layers} layers into {pp} x {v} pipeline stages"
    layers = [per + (i < extra) for i in range(pp)]
    layers[0] -= 1
    layers[-1] -= 1
    return StageSplit(pp=pp, chunk_layers=tuple(layers), method=DEEPSPEED)
