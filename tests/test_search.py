"""The search over a known landscape (``tests/fakesearch.py``): a fake cost model and fake backends, so the
point of each test is exact. The ranking itself is tested in test_ranking.py.
"""

import optuna
import pytest
from fakesearch import RecordingBackend, fake_estimate, fake_ranking

from autotune.backends import registry
from autotune.catalog import make_cluster
from autotune.errors import ConfigError
from autotune.plan import Framework, Recompute
from autotune.search import StudyOptions, make_sampler, opening_plans, run_study, top_trials
from autotune.space import SearchSpace, params_of
from autotune.store import open_study


def _study(seed=0):
    return optuna.create_study(direction="maximize", sampler=make_sampler(seed))


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.slow
def test_the_search_never_launches_an_infeasible_plan(tmp_path):
    ranking = fake_ranking()
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
    ranking = fake_ranking()
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
    ranking = fake_ranking()
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
    ranking = fake_ranking(space=space)
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
    ranking = fake_ranking(model="7b", space=space)
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
    ranking = fake_ranking(model="7b", space=space)
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
    ranking = fake_ranking()
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
            fake_ranking(),
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
