"""Ladders judged by forked workers give the ranking one process gives: same plans, order, counts."""

import os
from collections import Counter

import pytest

from autotune import rankworkers
from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate
from autotune.ranking import plan_search, rank_plans, rule_of
from autotune.space import PlanContext, enumerate_plans, load_space, resolve_choices
from autotune.verdicts import kept


def _search(**kwargs):
    """7b on 8 H100 without pipelining: a space with both fitting and out-of-memory plans."""
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    return plan_search(load_space(), model, cluster, pins={"pp": 1}, global_batch=64, seq_len=4096, **kwargs)


def _ranking(monkeypatch, workers: int, min_ladders: int):
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", str(workers))
    monkeypatch.setattr(rankworkers, "MIN_LADDERS", min_ladders)
    return _search()


def _summary(ranking):
    return (
        [(e.plan, e.tokens_per_s, e.memory_bytes_per_gpu) for e in ranking.feasible],
        ranking.pruned,
        ranking.num_legal,
        ranking.choices,
        None if ranking.closest is None else ranking.closest.plan,
    )


def test_workers_rank_exactly_as_one_process(monkeypatch):
    one = _ranking(monkeypatch, workers=1, min_ladders=1)
    two = _ranking(monkeypatch, workers=2, min_ladders=1)
    assert one.feasible and one.pruned.get("out of memory", 0) > 0  # both verdicts occur
    assert _summary(two) == _summary(one)


def test_a_callers_estimator_is_never_sent_to_workers(monkeypatch):
    """A caller's estimator may keep state (a recording, a calibration): it runs in this process."""
    calls = []

    def recording(model, cluster, plan):
        calls.append(plan)
        return estimate(model, cluster, plan)

    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", "2")
    monkeypatch.setattr(rankworkers, "MIN_LADDERS", 1)
    ranking = _search(estimator=recording)
    assert len(calls) >= len(ranking.feasible) > 0


def test_plans_that_do_not_fit_are_judged_on_memory_alone_with_the_same_ranking(monkeypatch):
    """The catalog model prices no step time for a plan its memory already rules out; a caller's estimator
    (the full ``estimate`` of every plan) ranks the same plans, counts and closest miss. The closest is
    estimated once at the end, with its step time."""
    priced = []
    real = rankworkers.estimate

    def counting(model, cluster, plan, **kw):
        priced.append(plan)
        return real(model, cluster, plan, **kw)

    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", "1")
    monkeypatch.setattr(rankworkers, "estimate", counting)
    fast = _search(estimator=counting)  # ``judge`` takes its memory-first path for the catalog estimate
    fast_priced = len(priced)
    full = _search(estimator=lambda m, c, p: real(m, c, p))
    assert fast.pruned.get("out of memory", 0) > 0 and fast.closest is not None
    assert _summary(fast) == _summary(full)
    assert fast_priced == len(fast.feasible) + 1  # the plans that fit, and the closest miss once
    assert fast.closest.time.step_time_s > 0


@pytest.mark.parametrize("value, expected", [("3", 3), ("1", 1), ("0", None), ("x", None)])
def test_workers_reads_the_environment(monkeypatch, value, expected):
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", value)
    assert rankworkers.workers() == (expected or len(os.sched_getaffinity(0)))


def test_a_worker_that_dies_costs_time_not_the_ranking(monkeypatch):
    """A killed worker (out of host memory, a signal) breaks the pool: the rest is judged here, no hang."""
    one = _ranking(monkeypatch, workers=1, min_ladders=1)
    monkeypatch.setattr(rankworkers, "_judge_part", _dies_on_its_second_part)
    broken = _ranking(monkeypatch, workers=2, min_ladders=1)
    assert _summary(broken) == _summary(one)


def test_a_worker_that_dies_costs_the_first_fit_search_time_not_its_tally(monkeypatch):
    """The same for a ranking that stops at its first fit (the "fits nowhere" hint), where nothing fits."""
    one = _first_fit(monkeypatch, workers=1)
    monkeypatch.setattr(rankworkers, "_judge_part", _dies_on_its_second_part)
    assert _summary(_first_fit(monkeypatch, workers=2)) == _summary(one)


_JUDGE_PART = rankworkers._judge_part
_PARTS_JUDGED = [0]


def _dies_on_its_second_part(part):
    """A worker's task (module level: the pool sends it by name): the worker dies when it is handed its
    second part."""
    _PARTS_JUDGED[0] += 1
    if _PARTS_JUDGED[0] == 2:
        os._exit(1)
    return _JUDGE_PART(part)


def test_a_progress_callback_counts_the_workers_estimates(monkeypatch):
    """The search's progress bar hears of each judged ladder (``on_ladder``) instead of wrapping the
    estimator, so a terminal user's ranking still forks: the catalog cost model reaches the workers, the
    ranking is the one a single process makes and the callback counts every estimate and every fit."""
    seen = []
    real_judged = rankworkers.judged_space

    def spy(choices, ctx, tally, estimator=estimate, variants=None, **kw):
        seen.append(estimator is estimate)
        return real_judged(choices, ctx, tally, estimator, variants, **kw)

    one = _ranking(monkeypatch, workers=1, min_ladders=1)
    calls = []

    def recording(model, cluster, plan):
        calls.append(plan)
        return estimate(model, cluster, plan)

    _search(estimator=recording)
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", "2")
    monkeypatch.setattr("autotune.ranking.judged_space", spy)
    counts = []
    two = _search(on_ladder=lambda estimated, fit: counts.append((estimated, fit)))
    assert seen == [True]  # the catalog estimator itself: the workers run
    assert _summary(two) == _summary(one)
    assert sum(e for e, _ in counts) == len(calls) and sum(f for _, f in counts) == len(two.feasible) > 0


def _ladders():
    """The ladders of ``_search``'s space, lazily, with their context."""
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    choices = resolve_choices(load_space(), model, cluster, {"pp": 1})
    ctx = PlanContext(model=model, cluster=cluster, global_batch=64, seq_len=4096)
    return enumerate_plans(choices, ctx), ctx


def _first_fit(monkeypatch, workers: int, model: str = "70b", gpus: int = 4, gpu: str = "a100-40gb"):
    """A ranking that stops at its first fit, as the "fits nowhere" hint asks a larger cluster; by default
    70B without pipelining on 4 A100-40GB, where none of its ~500 ladders fits."""
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", str(workers))
    monkeypatch.setattr(rankworkers, "MIN_LADDERS", 1)
    model_spec, cluster = load_model(model), make_cluster(num_gpus=gpus, gpu=gpu)
    choices = resolve_choices(load_space(), model_spec, cluster, {"pp": 1})
    ctx = PlanContext(model=model_spec, cluster=cluster, global_batch=64, seq_len=4096)
    return rank_plans(choices, ctx, first_fit=True)


def test_a_first_fit_search_where_nothing_fits_finds_nothing_in_workers_as_in_one_process(monkeypatch):
    """Each worker enumerates and judges its parts (``fits_only``) to the end of the space, and none fits,
    as in one process. Their tallies are not the space's: each drops, uncounted, the variants whose states
    it already found past the headroom (``rankworkers.StatesPast``), so what it counts depends on what it
    saw first."""
    one, two = _first_fit(monkeypatch, workers=1), _first_fit(monkeypatch, workers=2)
    assert not one.feasible and not two.feasible and one.num_legal > 100 and two.num_legal > 100


@pytest.mark.parametrize(
    "model, gpus, gpu",
    [("70b", 16, "a100-40gb"), ("70b", 4, "a100-40gb"), ("mixtral-8x7b", 8, "a100-40gb")],
)
def test_dropping_the_variants_whose_states_are_past_loses_no_plan_that_fits(model, gpus, gpu):
    """``fits_only`` with ``StatesPast``: a variant whose layout, first micro-batch and states-read fields
    equal those of a ladder whose first plan's states alone passed the headroom is dropped before its rules;
    every plan that fits without the drop still fits, in the same order (70B on 16 A100-40GB: some fit;
    on 4 none; Mixtral with experts on 8), and most ladders are dropped where states decide."""
    model_spec, cluster = load_model(model), make_cluster(num_gpus=gpus, gpu=gpu)
    choices = resolve_choices(load_space(), model_spec, cluster, {})
    ctx = PlanContext(model=model_spec, cluster=cluster, global_batch=256, seq_len=4096)

    def fits(past=None):  # the plans that fit, and the ladders judged
        ladders = enumerate_plans(choices, ctx, skip=past.skip if past else None)  # lazily: past learns
        judged = list(rankworkers.judged_here(ladders, ctx, estimate, True, past))
        return [v.estimate.plan for vs in judged for v in vs if v.reason is None and v.estimate], len(judged)

    (plans, n), (kept_plans, kept_n) = fits(), fits(rankworkers.StatesPast())
    assert kept_plans == plans
    assert kept_n < n / 2


def test_a_first_fit_search_stops_with_the_first_part_that_holds_a_fit(monkeypatch):
    """Where plans fit (7B on 8 H100), the workers' ranking stops with the first part that holds one: it
    holds the first fit of one process (which stops at its first ladder), every plan it keeps fits in the
    whole ranking too, and the parts after it are not judged."""
    kw = {"model": "7b", "gpus": 8, "gpu": "h100-sxm"}
    one, two = _first_fit(monkeypatch, workers=1, **kw), _first_fit(monkeypatch, workers=2, **kw)
    monkeypatch.setenv("AUTOTUNE_PLAN_WORKERS", "1")
    whole = _search()
    plans = lambda ranking: {e.plan for e in ranking.feasible}  # noqa: E731
    assert plans(one) and plans(one) <= plans(two) <= plans(whole)
    assert one.num_legal <= two.num_legal < whole.num_legal


def test_fits_only_finds_the_plans_that_fit_and_stops_each_ladder_where_a_full_judge_does():
    """``fits_only`` calls a plan a miss from its model states alone when they overfill the headroom: the
    same plans fit, each ladder stops at the same micro-batch, and many misses skip the rest of their
    memory (70B on 16 A100-40GB, where most layouts cannot hold their states)."""
    model, cluster = load_model("70b"), make_cluster(num_gpus=16, gpu="a100-40gb")
    choices = resolve_choices(load_space(), model, cluster, {})
    ctx = PlanContext(model=model, cluster=cluster, global_batch=64, seq_len=4096)
    floored = fitting = 0
    for ladder in enumerate_plans(choices, ctx):
        full, quick = rankworkers.judge(ladder, ctx), rankworkers.judge(ladder, ctx, fits_only=True)
        fits = [v.estimate for v in quick if v.reason is None]
        assert fits == [v.estimate for v in full if v.reason is None]
        assert [(v.reason is None, v.pruned) for v in quick] == [(v.reason is None, v.pruned) for v in full]
        floored += any("model states alone" in (v.reason or "") for v in quick)
        fitting += sum(v.reason is None for v in quick)
    assert floored > 100 and fitting > 0


@pytest.mark.parametrize("gpus, pins", [(16, {}), (4, {"offload": False})])
def test_a_miss_its_model_states_decide_skips_the_rest_of_its_memory_with_the_same_ranking(
    monkeypatch, gpus, pins
):
    """Once a miss is seen, a plan whose model states alone are surely out of memory (past the device even
    after the allocator's slack, no other rule broken) and further over than that miss is counted out of
    memory without the rest of its memory: the same plans fit, each ladder stops at the same micro-batch
    with the same rule, and the least overcommitted miss is the same, as when every miss is priced in full
    (70B on 16 A100-40GB, where most layouts cannot hold their states; on 4 without offload none fits,
    and the closest miss is one of those whose states alone overfill the device)."""
    model, cluster = load_model("70b"), make_cluster(num_gpus=gpus, gpu="a100-40gb")
    choices = resolve_choices(load_space(), model, cluster, pins)
    ctx = PlanContext(model=model, cluster=cluster, global_batch=64, seq_len=4096)
    ladders = list(enumerate_plans(choices, ctx))
    quick = list(rankworkers.judged_here(ladders, ctx, estimate, False))
    full = [rankworkers.judge(ladder, ctx) for ladder in ladders]  # no miss seen: every miss priced

    def seen(verdicts):
        return [(v.estimate, rule_of(v.reason or ""), v.pruned, v.plan) for v in verdicts]

    assert [seen(q) for q in quick] == [seen(f) for f in full]
    skipped = [v for q in quick for v in q if v.plan is not None and v.overcommit is None]
    closest = min(v.overcommit for f in full for v in f if v.overcommit is not None)
    assert min(v.overcommit for q in quick for v in q if v.overcommit is not None) == closest
    assert len(skipped) > 100 and all("model states alone" in (v.reason or "") for v in skipped)


def test_parts_kept_and_merged_in_order_keep_what_all_ladders_kept_at_once():
    """Workers send back each part as the ranking keeps it (``verdicts.kept``) and the ranking merges the
    parts in order, the closest miss by strict ``<``: the plans that fit, the counts and the closest miss
    (the first of equals) are those of keeping every ladder at once. Misses are made to tie so that the
    first-of-equals rule is exercised across parts."""
    ladders, ctx = _ladders()
    verdicts = [rankworkers.judge(ladder, ctx) for ladder in ladders]
    tied = [[v._replace(overcommit=1.5) if v.overcommit is not None else v for v in vs] for vs in verdicts]
    whole = kept(tied, ctx)
    assert whole.closest is not None and sum(v.overcommit is not None for vs in tied for v in vs) > 2
    pruned, feasible, ladders_seen, closest = Counter(), [], [], None
    for a in range(0, len(tied), 7):
        part = kept(tied[a : a + 7], ctx)
        pruned.update(part.pruned)
        feasible += part.feasible
        ladders_seen += part.ladders
        if part.closest is not None and (closest is None or part.closest[0] < closest[0]):
            closest = part.closest
    assert feasible == whole.feasible and ladders_seen == whole.ladders
    assert pruned == whole.pruned and whole.pruned["out of memory"] > 0 and 0 not in whole.pruned.values()
    assert closest is not None and closest[1] is whole.closest[1]  # the same plan: the first of the equals


def test_a_workers_part_holds_only_the_plans_that_fit_and_its_closest_miss(monkeypatch):
    """What travels back from a worker: no miss's plan or reason but the part's closest (``Kept``)."""
    ladders, ctx = _ladders()
    verdicts = [rankworkers.judge(ladder, ctx) for ladder in ladders]
    part = kept(verdicts, ctx)
    assert set(part._fields) == {"feasible", "ladders", "closest", "pruned"}
    assert len(part.feasible) == sum(v.reason is None for vs in verdicts for v in vs)
    assert all(e.feasible for e in part.feasible)
