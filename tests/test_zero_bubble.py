"""The zero-bubble schedules (torch's ``ScheduleInterleavedZeroBubble`` and ``ScheduleZBVZeroBubble``) against
torch's own action lists: the bubble and the micro-batches in flight the cost model prices are what a replay
of the schedule torch builds gives; the frameworks that do not run them refuse them in one line; the
emitters name them."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining import schedules as torch_schedules

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import pipeline
from autotune.costmodel.inflight import in_flight_of
from autotune.costmodel.memory import stage_memory
from autotune.costmodel.steptime import step_time
from autotune.emit.torchtitan import to_torchtitan_config
from autotune.errors import ConfigError
from autotune.legality import plan_errors
from autotune.plan import ParallelPlan, Schedule
from autotune.space import PlanContext, SearchSpace, Tally, enumerate_plans, resolve_choices
from autotune.stagesplit import split_layers

CASES = [(2, 2, 4), (4, 2, 8), (4, 2, 16), (8, 2, 16), (4, 4, 8), (8, 4, 32)]
"""(PP, virtual stages, micro-batches)."""
TORCH = {
    Schedule.INTERLEAVED: "ScheduleInterleaved1F1B",
    Schedule.INTERLEAVED_ZB: "ScheduleInterleavedZeroBubble",
}


def _actions(schedule: Schedule, pp: int, v: int, m: int) -> dict[int, list]:
    """Each rank's compute actions as torch orders them (its per-rank planner, without process groups)."""
    cls = getattr(torch_schedules, TORCH[schedule])
    out = {}
    for rank in range(pp):
        obj = cls.__new__(cls)
        obj.pp_group_size, obj.n_local_stages, obj.rank, obj._n_microbatches = pp, v, rank, m
        obj.number_of_rounds = max(1, m // pp)
        obj.microbatches_per_round = m // obj.number_of_rounds
        obj.stages = [SimpleNamespace(group_size=pp, group_rank=rank)] * v
        out[rank] = [a for a in obj._calculate_single_rank_operations(rank) if a is not None]
    return out


def _kind(action) -> str:
    name = str(action.computation_type)
    return "W" if "WEIGHT" in name else "I" if "INPUT" in name else "B" if "BACKWARD" in name else "F"


def _makespan(actions: dict[int, list], pp: int, v: int, f: float, i: float, w: float) -> float:
    """Replay: each rank runs its actions in order, each as soon as its inputs exist (a forward after the
    previous stage's, an input gradient after the next stage's, a weight gradient after its own input one)."""
    last = pp * v - 1
    done: dict[tuple[str, int, int], float] = {}
    free, idx = [0.0] * pp, [0] * pp
    seconds = {"F": f, "I": i, "W": w, "B": i + w}
    progressed = True
    while progressed:
        progressed = False
        for r in range(pp):
            while idx[r] < len(actions[r]):
                a = actions[r][idx[r]]
                k, stage, mb = _kind(a), a.stage_index, a.microbatch_index
                if k == "F":
                    needs = [("F", stage - 1, mb)] if stage > 0 else []
                elif k in "IB":
                    needs = [("I", stage + 1, mb)] if stage < last else [("F", stage, mb)]
                else:
                    needs = [("I", stage, mb)]
                if any(n not in done for n in needs):
                    break
                end = max([free[r]] + [done[n] for n in needs]) + seconds[k]
                free[r] = end
                done[("I" if k == "B" else k, stage, mb)] = end
                idx[r] += 1
                progressed = True
    assert all(idx[r] == len(actions[r]) for r in range(pp))
    return max(free)


@pytest.mark.parametrize("pp,v,m", CASES)
@pytest.mark.parametrize("fiw", [(1.0, 1.0, 1.0), (1.0, 1.3, 0.7), (1.0, 1.6, 0.4)])
def test_bubble_is_what_a_replay_of_torchs_schedule_gives(pp, v, m, fiw):
    f, i, w = fiw
    chunk = f + i + w
    ideal = m * v * chunk  # every rank's own work
    for schedule, share in ((Schedule.INTERLEAVED, None), (Schedule.INTERLEAVED_ZB, w / chunk)):
        replayed = _makespan(_actions(schedule, pp, v, m), pp, v, f, i, w) - ideal
        priced = pipeline.bubble_fraction(pp, m, v, share) * m * v * chunk
        assert priced == pytest.approx(replayed), schedule


def _held(actions: list, until: str) -> int:
    """Most chunk micro-batches a rank holds between a forward and the backward action ``until``."""
    held = most = 0
    for a in actions:
        k = _kind(a)
        held += k == "F"
        held -= k == until or k == "B"
        most = max(most, held)
    return most


@pytest.mark.parametrize("pp,v,m", CASES)
def test_in_flight_is_counted_from_torchs_action_lists(pp, v, m):
    for schedule, until in ((Schedule.INTERLEAVED, "B"), (Schedule.INTERLEAVED_ZB, "W")):
        actions = _actions(schedule, pp, v, m)
        for rank in range(pp):
            assert in_flight_of(m, pp, v, schedule, rank) == pytest.approx(_held(actions[rank], until) / v)


def _plan(**fields) -> ParallelPlan:
    base = dict(tp=8, pp=4, dp=2, virtual_stages=2, schedule="interleaved-zb", global_batch=32, seq_len=8192)
    return ParallelPlan(**{**base, "framework": "fsdp", "sharding": "fsdp-full", **fields})


def _refusal(**fields) -> str:
    with pytest.raises(ConfigError) as err:
        _plan(**fields)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_frameworks_that_do_not_run_it_refuse_it_in_one_line():
    assert plan_errors(_plan()) == []
    megatron = _refusal(framework="megatron", sharding="zero1")
    assert "ScheduleInterleavedZeroBubble" in megatron and megatron.endswith("--schedule interleaved")
    assert _refusal(framework="deepspeed", sharding="zero1", tp=1, dp=16).endswith("--schedule 1f1b")
    assert "--compile" in _refusal(compile=True)
    assert "virtual stages >= 2" in _refusal(virtual_stages=1)
    # torch runs m // PP rounds and needs m divisible by them: 10 micro-batches at PP 4 make 2 rounds (fine),
    # 9 make 2 rounds (not)
    assert plan_errors(_plan(global_batch=20)) == []
    assert "rounds" in _refusal(global_batch=18)


def test_torchtitan_names_the_schedule():
    parallelism = to_torchtitan_config(_plan(), load_model("70b"))["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "InterleavedZeroBubble"


def test_it_prices_a_smaller_bubble_and_a_second_recompute():
    """The deferred weight gradients fill part of the drain; full AC re-runs each block's forward in the
    weight pass too (non-reentrant checkpoint under two autograd passes)."""
    model, cluster = load_model("70b"), make_cluster(num_gpus=64, gpu="h100-sxm")
    zb = step_time(model, cluster, _plan(recompute="full"))
    il = step_time(model, cluster, _plan(recompute="full", schedule="interleaved"))
    assert 0 < zb.pp_bubble_s < il.pp_bubble_s
    assert zb.recompute_s == pytest.approx(2 * il.recompute_s)
    assert zb.hardware_flops > il.hardware_flops == pytest.approx(il.hardware_flops)
    none_zb = step_time(model, cluster, _plan())
    none_il = step_time(model, cluster, _plan(schedule="interleaved"))
    assert none_zb.recompute_s == none_il.recompute_s == 0
    assert none_zb.step_time_s < none_il.step_time_s


# ZBV (torch's ScheduleZBVZeroBubble): two chunks per rank in a V, m >= 2 PP - 1 micro-batches
ZBV_CASES = [(2, 3), (2, 8), (3, 5), (4, 7), (4, 16), (5, 12), (8, 15), (8, 32), (16, 31)]
"""(PP, micro-batches)."""


def _zbv_actions(pp: int, m: int) -> dict[int, list]:
    """Each rank's compute actions of torch's ZBV (its per-rank planner, without process groups)."""
    cls = torch_schedules.ScheduleZBVZeroBubble
    out = {}
    for rank in range(pp):
        obj = cls.__new__(cls)
        obj.pp_group_size, obj.num_stages, obj._n_microbatches = pp, 2 * pp, m
        out[rank] = [a for a in obj._calculate_single_rank_operations(rank) if a is not None]
    return out


def test_zbv_places_the_chunks_in_a_v():
    actions = _zbv_actions(4, 8)
    assert {r: sorted({a.stage_index for a in acts}) for r, acts in actions.items()} == {
        0: [0, 7],
        1: [1, 6],
        2: [2, 5],
        3: [3, 4],
    }


@pytest.mark.parametrize("pp,m", ZBV_CASES)
def test_zbv_bubble_is_what_a_replay_of_torchs_schedule_gives(pp, m):
    """The eight-form maximum against a numeric replay, at fixed and at random forward / input / weight
    splits (the forms were found by a symbolic replay; this checks them on cases they were not read from)."""
    rng = random.Random(pp * 1000 + m)
    splits = [(1.0, 1.0, 1.0), (1.0, 1.3, 0.7), (1.0, 1.6, 0.4), (1.0, 1.0, 2.0)]
    splits += [(rng.uniform(0.3, 2), rng.uniform(0.3, 3), rng.uniform(0, 2)) for _ in range(20)]
    actions = _zbv_actions(pp, m)
    for f, i, w in splits:
        chunk = f + i + w
        replayed = _makespan(actions, pp, 2, f, i, w) - 2 * m * chunk
        priced = pipeline.zbv_bubble_fraction(pp, m, f / chunk, w / chunk) * 2 * m * chunk
        assert priced == pytest.approx(replayed, abs=1e-9), (f, i, w)


@pytest.mark.parametrize("pp,m", ZBV_CASES)
def test_zbv_in_flight_is_counted_from_torchs_action_lists(pp, m):
    actions = _zbv_actions(pp, m)
    for rank in range(pp):
        assert in_flight_of(m, pp, 2, Schedule.ZBV, rank) == pytest.approx(_held(actions[rank], "W") / 2)


def test_zbv_is_refused_where_it_cannot_run_in_one_line():
    zbv = dict(schedule="zbv")
    assert plan_errors(_plan(**zbv)) == []
    megatron = _refusal(framework="megatron", sharding="zero1", **zbv)
    assert "ScheduleZBVZeroBubble" in megatron and megatron.endswith("--schedule interleaved")
    assert "--compile" in _refusal(compile=True, **zbv)
    assert _refusal(virtual_stages=4, **zbv).endswith("--virtual-stages 2")
    # PP 4 needs 7 micro-batches to fill the V: torch pads fewer with idle slots
    assert plan_errors(_plan(global_batch=14, **zbv)) == []
    assert "2 PP - 1 = 7" in _refusal(global_batch=12, **zbv)


def test_zbv_puts_the_head_and_the_embedding_on_rank_0():
    """Llama-3.1-405B (126 blocks) at PP 8 x 2: torchtitan's split gives the first and last chunk 7 blocks,
    the others 8; in the V rank 0 holds both (14 blocks, the embedding and the head), the rest 16."""
    model = load_model("llama3-405b")
    plan = _plan(tp=8, pp=8, dp=8, schedule="zbv", global_batch=128)
    split = split_layers(model.num_layers, plan)
    assert split.head_rank == 0 and split.all_rank_layers() == (14,) + (16,) * 7
    assert pipeline.rank_blocks(model.num_layers, plan, 1.0) == (14, 16)


def test_zbv_memory_follows_the_v():
    """Llama-3-8B at PP 4 x 2 (chunks of 4, 5, 4, 4, 4, 4, 4, 3 blocks as torchtitan cuts them): in the V
    rank 0 holds 7 blocks, the embedding and the 525M-parameter head, rank 3 8 blocks; looped, rank 0 holds 8
    blocks and the embedding, rank 3 7 blocks and the head."""
    model, cluster = load_model("llama3-8b"), make_cluster(num_gpus=64, gpu="h100-sxm")
    v, looped = _plan(schedule="zbv"), _plan()
    weights = {
        p.schedule: [stage_memory(model, cluster, p, rank=r).weights_bytes for r in (0, 3)]
        for p in (v, looped)
    }
    assert weights[Schedule.ZBV][0] > weights[Schedule.INTERLEAVED_ZB][0]
    assert weights[Schedule.ZBV][1] < weights[Schedule.INTERLEAVED_ZB][1]


def test_torchtitan_names_zbv():
    parallelism = to_torchtitan_config(_plan(schedule="zbv"), load_model("70b"))["parallelism"]
    assert parallelism["pipeline_parallel_schedule"] == "ZBVZeroBubble"


def test_a_space_without_two_virtual_stages_prunes_zbv_with_the_reason():
    model, cluster = load_model("small"), make_cluster(num_gpus=8, gpu="a100-80gb")
    knobs = {"pp": (2,), "framework": ("fsdp",), "schedule": ("zbv",)}
    ctx = PlanContext(model=model, cluster=cluster, global_batch=16, seq_len=512)
    for stages, legal in (((2, 4), True), ((4,), False)):
        space = SearchSpace(knobs={**knobs, "virtual_stages": stages}, source="t")
        tally = Tally()
        ladders = enumerate_plans(resolve_choices(space, model, cluster), ctx, tally)
        plans = [ladder.plan(m) for ladder in ladders for m in ladder.micro_batches]
        assert bool(plans) is legal and all(p.virtual_stages == 2 for p in plans)
        assert ("zbv needs exactly 2 virtual stages" in tally.pruned) is not legal
