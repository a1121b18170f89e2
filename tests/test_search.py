"""The search over a known landscape: a fake cost model and fake backends, so the point of each test is exact.

The fake cost model (``fake_memory``/``fake_step_time``): memory grows with the micro-batch and shrinks with
TP, PP, sharding and recompute, and a throughput with one best plan.
"""

import optuna
import pytest

from autotune.backends import registry
from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.memory import MemoryBreakdown
from autotune.costmodel.steptime import TimeBreakdown
from autotune.errors import ConfigError
from autotune.headroom import headroom_reason
from autotune.plan import Framework, Recompute
from autotune.ranking import plan_search, rule_of
from autotune.search import StudyOptions, make_sampler, opening_plans, run_study, top_trials
from autotune.space import SearchSpace, load_space, params_of, resolve_choices
from autotune.store import open_study
from autotune.trials.result import TrialResult, TrialStatus

_ACT = {"none": 1.0, "selective": 0.6, "full": 0.25}
_SLOW = {"none": 1.0, "selective": 1.05, "full": 1.35}


def fake_memory(model, cluster, plan):
    """Weights+grads+Adam (16 B/param) over TP x PP and sharding; activations grow with the micro-batch."""
    states = 16.0 * model.num_params / (plan.tp * plan.pp) / (plan.shard_degree if plan.zero_stage else 1)
    if plan.offload:
        states /= 4
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    acts = 40.0 * tokens * model.hidden_size * model.num_layers / plan.pp / plan.tp
    return MemoryBreakdown(
        weights_bytes=states,
        gradients_bytes=0.0,
        optimizer_bytes=0.0,
        activations_bytes=acts * _ACT[str(plan.recompute)],
        logits_bytes=0.0,
        prefetch_bytes=0.0,
        comm_buffer_bytes=0.0,
        reserve_bytes=2 * 2**30,
    )


def fake_step_time(model, cluster, plan):
    """6N FLOPs at 40% of peak, slowed by recompute, a pipeline bubble, TP beyond a node, offload and CP."""
    flops = 6.0 * model.num_params * plan.tokens_per_step
    compute = flops / plan.world_size / (0.4 * cluster.gpu.bf16_flops) * _SLOW[str(plan.recompute)]
    bubble = compute * (plan.pp - 1) / (plan.num_microbatches * plan.virtual_stages)
    tp_comm = compute * 0.03 * (plan.tp - 1) * (8 if plan.tp > cluster.gpus_per_node else 1)
    tp_comm /= plan.micro_batch
    return TimeBreakdown(
        compute_s=compute,
        recompute_s=0.0,
        tp_comm_s=tp_comm,
        cp_comm_s=0.02 * compute * plan.cp,
        pp_p2p_s=0.0,
        pp_bubble_s=bubble,
        dp_comm_s=0.01 * compute * (plan.zero_stage == 3),
        optimizer_s=0.0,
        offload_s=0.5 * compute * plan.offload,
        model_flops=flops,
        hardware_flops=flops,
    )


def fake_estimate(model, cluster, plan):
    memory = fake_memory(model, cluster, plan)
    fits = memory.total_bytes <= cluster.gpu.memory_bytes
    reasons = () if fits else (f"out of memory: needs {memory.total_bytes} bytes",)
    return Estimate(
        plan=plan,
        feasible=fits,
        reasons=reasons,
        memory=memory,
        memory_capacity_bytes=cluster.gpu.memory_bytes,
        time=fake_step_time(model, cluster, plan),
        num_gpus=plan.world_size,
        peak_flops_per_gpu=cluster.gpu.bf16_flops,
    )


class RecordingBackend:
    """Records every plan it is asked to run; 'measures' the fake prediction times ``bonus(plan)``."""

    name = "recording"
    measures = True

    def __init__(self, bonus=lambda plan: 1.0):
        self.plans, self._bonus = [], bonus

    def run(self, request, report=None):
        self.plans.append(request.plan)
        est = fake_estimate(request.model, request.cluster, request.plan)
        return TrialResult(status=TrialStatus.OK, tokens_per_s=est.tokens_per_s * self._bonus(request.plan))


def _ranking(model="13b", gpus=8, space=None, **kw):
    model, cluster = load_model(model), make_cluster(num_gpus=gpus, gpu=kw.pop("gpu", "h100-sxm"))
    return plan_search(
        space or load_space(),
        model,
        cluster,
        pins=kw.pop("pins", {}),
        global_batch=kw.pop("gb", 64),
        seq_len=4096,
        estimator=fake_estimate,
        **kw,
    )


def _study(seed=0):
    return optuna.create_study(direction="maximize", sampler=make_sampler(seed))


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_rule_of_drops_the_numbers():
    assert rule_of("out of memory: needs 91.2 GiB per GPU but h100-sxm has 79.6 GiB") == "out of memory"
    assert rule_of("TP 16 does not divide KV heads 8") == "TP does not divide KV heads"


@pytest.mark.slow
def test_micro_batch_cutoff_loses_no_feasible_plan():
    ranking = _ranking()
    every = [fake_estimate(ranking.ctx.model, ranking.ctx.cluster, est.plan) for est in ranking.feasible]
    assert ranking.feasible and ranking.pruned.get("out of memory", 0) > 0
    brute = _brute_force_feasible(ranking)
    assert [e.plan for e in ranking.feasible] == [e.plan for e in brute] == [e.plan for e in every]
    above = ranking.pruned.get("above the memory headroom", 0)
    assert ranking.num_legal == len(brute) + ranking.pruned["out of memory"] + above


def _brute_force_feasible(ranking):
    from autotune.space import enumerate_plans

    choices = resolve_choices(load_space(), ranking.ctx.model, ranking.ctx.cluster)
    ests = [
        fake_estimate(ranking.ctx.model, ranking.ctx.cluster, ladder.plan(m))
        for ladder in enumerate_plans(choices, ranking.ctx)
        for m in ladder.micro_batches
    ]
    fits = (e for e in ests if e.feasible and headroom_reason(e, ranking.ctx.memory_headroom) is None)
    return sorted(fits, key=lambda e: e.tokens_per_s, reverse=True)


@pytest.mark.slow
def test_the_search_never_launches_an_infeasible_plan(tmp_path):
    ranking = _ranking()
    backend = RecordingBackend()
    study = _study()
    launched = run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=25, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    assert launched == len(backend.plans) == 25
    assert all(fake_estimate(ranking.ctx.model, ranking.ctx.cluster, p).feasible for p in backend.plans)
    rejected = [t for t in study.trials if t.user_attrs.get("status") == "infeasible"]
    assert rejected, "the landscape should make TPE propose some infeasible plans"
    for t in rejected:
        assert t.state is optuna.trial.TrialState.PRUNED and t.user_attrs["reason"]
        assert max(t.constraints.values()) > 0
    oom = [t for t in rejected if t.constraints["memory_excess_bytes"] > 0]
    assert oom and all(t.user_attrs["reason"].startswith("out of memory") for t in oom)


@pytest.mark.slow
def test_opening_plans_cover_the_layouts_before_the_next_best_of_one():
    ranking = _ranking()
    feasible = ranking.feasible
    layouts = list(dict.fromkeys((e.plan.tp, e.plan.pp, e.plan.dp, e.plan.cp) for e in feasible))
    assert len(layouts) >= 2
    opening = opening_plans(feasible, len(feasible))
    assert sorted(map(id, opening)) == sorted(map(id, feasible))  # a permutation
    heads = opening[: len(layouts)]
    # one per layout, each the best predicted of its layout, layouts in the order of their best plan
    assert [(e.plan.tp, e.plan.pp, e.plan.dp, e.plan.cp) for e in heads] == layouts
    for e in heads:
        same = [
            f
            for f in feasible
            if (f.plan.tp, f.plan.pp, f.plan.dp, f.plan.cp) == (e.plan.tp, e.plan.pp, e.plan.dp, e.plan.cp)
        ]
        assert e is same[0]
    rest = opening[len(layouts) :]
    assert rest == [e for e in feasible if e not in heads]  # then by predicted rank
    assert opening_plans(feasible, 1) == feasible[:1]  # the best plan is always measured first


@pytest.mark.slow
def test_top_k_is_enqueued_first_and_only_once(tmp_path):
    ranking = _ranking()
    study = _study()
    run_study(
        study,
        ranking,
        RecordingBackend(),
        StudyOptions(n_trials=3, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    first = study.trials[:3]
    opening = opening_plans(ranking.feasible, 3)
    assert [t.params for t in first] == [params_of(e.plan) for e in opening]
    assert [t.user_attrs["predicted_rank"] for t in first] == [ranking.feasible.index(e) + 1 for e in opening]
    run_study(
        study,
        ranking,
        RecordingBackend(),
        StudyOptions(n_trials=0, top_k=3),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))  # skip_if_exists: not queued again


@pytest.mark.slow
def test_tpe_finds_the_measured_best_when_the_cost_model_misranks_it(tmp_path):
    """On this 'cluster' TP2 with selective recompute measures 30% faster than the cost model says.

    177 feasible plans; 40 trials at random would find the best with p ~ 0.2. Seeded TPE finds it.
    """
    space = SearchSpace(
        knobs={
            "tp": (1, 2, 4, 8),
            "pp": (1, 2, 4),
            "micro_batch": (1, 2, 4, 8),
            "recompute": ("none", "selective", "full"),
            "sharding": ("none", "fsdp-full", "fsdp-grad-op"),
        },
        source="small",
    )
    ranking = _ranking(space=space)
    assert len(ranking.feasible) == 177

    def bonus(plan):
        return 1.3 if plan.recompute is Recompute.SELECTIVE and plan.tp == 2 else 1.0

    backend = RecordingBackend(bonus)
    best_measured = max(ranking.feasible, key=lambda e: e.tokens_per_s * bonus(e.plan))
    assert ranking.feasible[0].plan != best_measured.plan
    study = _study(seed=0)
    run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=40, top_k=2),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    best = top_trials(study, 1)[0]
    assert best.value == pytest.approx(best_measured.tokens_per_s * 1.3)


def test_duplicate_proposals_are_not_run_twice(tmp_path):
    space = SearchSpace(knobs={"tp": (1, 2), "micro_batch": (1, 2), "sharding": ("fsdp-full",)}, source="t")
    ranking = _ranking(model="7b", space=space)
    backend = RecordingBackend()
    study = _study()
    run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=30, top_k=0),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    assert len(backend.plans) == len({p for p in backend.plans}) == len(ranking.feasible)
    assert any("duplicate_of" in t.user_attrs for t in study.trials)


@pytest.mark.slow
def test_parameters_that_name_the_same_plan_run_it_once_and_every_plan_gets_its_turn(tmp_path):
    """At PP 1 the schedule and virtual stages mean nothing, so (pp 1, gpipe) and (pp 1, 1f1b) are one plan:
    it runs once. TPE repeats itself in a small space; the cost model's ranking then enqueues what is left,
    so asking for as many trials as there are plans runs every plan."""
    space = SearchSpace(
        knobs={
            "tp": (1, 2),
            "pp": (1, 2),
            "micro_batch": (1, 2),
            "sharding": ("fsdp-full",),
            "schedule": ("1f1b", "gpipe", "interleaved"),
            "virtual_stages": (1, 2),
            "recompute": ("none", "selective"),
        },
        source="t",
    )
    ranking = _ranking(model="7b", space=space)
    backend = RecordingBackend()
    study = _study(seed=3)
    launched = run_study(
        study,
        ranking,
        backend,
        StudyOptions(n_trials=len(ranking.feasible), top_k=0),
        trials_dir=tmp_path,
        estimator=fake_estimate,
    )
    assert launched == len(backend.plans) == len(set(backend.plans)) == len(ranking.feasible)
    assert {str(p.schedule) for p in backend.plans if p.pp == 1} == {"1f1b"}  # normalised at PP 1


@pytest.mark.slow
def test_resume_adds_trials_to_the_same_study(tmp_path):
    ranking = _ranking()
    identity = {"model": "13b", "space": ranking.choices}

    def session(resume=False, force=False, ident=identity):
        study, _, url = open_study(
            name="s",
            runs_dir=tmp_path,
            storage=None,
            identity=ident,
            resume=resume,
            force=force,
            sampler=make_sampler(0),
        )
        run_study(
            study,
            ranking,
            RecordingBackend(),
            StudyOptions(n_trials=3, top_k=2),
            trials_dir=tmp_path,
            estimator=fake_estimate,
        )
        return study, url

    first, url = session()
    assert url == f"sqlite:///{tmp_path / 's' / 'study.db'}"
    with pytest.raises(ConfigError, match="already exists.*--resume"):
        session()
    with pytest.raises(ConfigError, match="was made for 13b.*model '13b', this run asks for '70b'"):
        session(resume=True, ident={**identity, "model": "70b"})
    again, _ = session(resume=True)
    assert again.study_name == first.study_name and len(again.trials) >= 6
    assert len(optuna.get_all_study_names(url)) == 1
    fresh, _ = session(force=True)
    assert len(_launched(fresh)) == 3 and len(_launched(again)) == 6


def _launched(study):
    return [
        t for t in study.trials if t.user_attrs.get("status") == "ok" and "duplicate_of" not in t.user_attrs
    ]


@pytest.mark.slow
def test_bad_input_names_the_fix():
    with pytest.raises(ConfigError, match=r"--global-batch 3: no DP x micro-batch .*\(DP can be 2\); try"):
        _ranking(model="70b", gpus=16, gb=3, pins={"tp": 8, "pp": 1, "cp": 1})
    with pytest.raises(ConfigError, match="no legal plan.*TP does not divide the KV heads"):
        _ranking(model="70b", gpus=16, pins={"tp": 16})
    cluster_at = lambda n: make_cluster(num_gpus=n)  # noqa: E731
    with pytest.raises(ConfigError, match=r"70b fits nowhere on 2 h100-sxm.*fit on (\d+) GPUs: --gpus \1"):
        _ranking(model="70b", gpus=2, cluster_at=cluster_at)


def test_a_backend_limits_the_frameworks():
    ranking = _ranking(frameworks={Framework.DEEPSPEED})
    assert ranking.choices["framework"] == ["deepspeed"]
    with pytest.raises(ConfigError, match="cannot be measured here"):
        _ranking(pins={"framework": "megatron"}, frameworks={Framework.DEEPSPEED})


@pytest.mark.parametrize(
    ("gpus", "local", "device", "real", "note"),
    [
        (8, 8, None, True, None),
        (
            8,
            0,
            None,
            False,
            "this node has 0 of the 8 GPUs; to measure, run the same command on the GPU node",
        ),
        (16, 8, None, False, "the plan spans 2 nodes"),
        (4, 0, "cpu", True, None),
    ],
)
def test_auto_measures_only_where_the_trial_can_run(monkeypatch, gpus, local, device, real, note):
    monkeypatch.setattr(registry, "local_gpu_count", lambda: local)
    choice = registry.get_backend("auto", cluster=make_cluster(num_gpus=gpus), device=device)
    assert choice.backend.measures is real
    assert choice.frameworks == ({Framework.FSDP, Framework.DEEPSPEED} if real else None)
    assert (note is None and choice.note is None) or note in choice.note


def test_cuda_without_the_gpus_is_bad_input(monkeypatch):
    monkeypatch.setattr(registry, "local_gpu_count", lambda: 0)
    with pytest.raises(ConfigError, match="--device cuda: this node has 0 CUDA GPUs"):
        registry.get_backend("auto", cluster=make_cluster(num_gpus=8), device="cuda")


@pytest.mark.slow
def test_an_interrupted_trial_is_not_left_running(tmp_path):
    class Interrupted(RecordingBackend):
        def run(self, request, report=None):
            raise KeyboardInterrupt

    study = _study()
    with pytest.raises(KeyboardInterrupt):
        run_study(
            study,
            _ranking(),
            Interrupted(),
            StudyOptions(n_trials=1, top_k=1),
            trials_dir=tmp_path,
            estimator=fake_estimate,
        )
    stopped, again = study.trials
    assert stopped.state is optuna.trial.TrialState.FAIL and stopped.user_attrs["status"] == "interrupted"
    # its plan is queued again, and taken first by the next run (before the rest of the queue)
    assert again.state is optuna.trial.TrialState.WAITING and again.params == stopped.params
    assert again.system_attrs["failed_trial"] == stopped.number
