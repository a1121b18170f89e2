"""The typed trial record reads studies written before it (the storage format is unchanged) and defines
"the same plan" once."""

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune.catalog import load_model, make_cluster
from autotune.plan import ParallelPlan
from autotune.report.analysis import failed, pruned
from autotune.search import top_trials
from autotune.space import PlanContext, params_of, plan_from_params
from autotune.trialrecord import Attr, outcome_attrs, plan_key, record_of
from autotune.trials.result import TrialResult, TrialStatus

_PLAN = ParallelPlan(tp=2, pp=1, dp=2, micro_batch=1, global_batch=8, seq_len=128)


def _old_study(path):
    """A study as autotune wrote it before ``trialrecord``: bare string keys in ``user_attrs``."""
    storage = f"sqlite:///{path / 'study.db'}"
    study = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    dist = {"tp": CategoricalDistribution([1, 2])}
    done = {"state": TrialState.COMPLETE, "value": 1000.0, "params": {"tp": 2}, "distributions": dist}
    predicted = {
        "tokens_per_s": 900.0,
        "mfu": 0.3,
        "step_time_s": 1.0,
        "memory_bytes_per_gpu": 1e9,
        "bottleneck": "compute",
        "memory_capacity_bytes": 2e9,
    }
    study.add_trial(
        create_trial(
            **done,
            user_attrs={
                "plan": _PLAN.to_dict(),
                "predicted": predicted,
                "status": "ok",
                "value_source": "measured",
                "source": "cost model",
                "measured": {"tokens_per_s": 1000.0, "wall_s": 12.5},
            },
        )
    )
    study.add_trial(
        create_trial(**done, user_attrs={"plan": _PLAN.to_dict(), "status": "ok", "duplicate_of": 0})
    )
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params={"tp": 1},
            distributions=dist,
            user_attrs={"status": "infeasible", "reason": "out of memory: needs 9 GiB"},
        )
    )
    study.add_trial(
        create_trial(
            state=TrialState.PRUNED,
            params={"tp": 1},
            distributions=dist,
            user_attrs={"plan": _PLAN.to_dict(), "status": "oom", "error": "CUDA out of memory\ntraceback"},
        )
    )
    return optuna.load_study(study_name="old", storage=storage)


def test_an_old_study_loads_as_records(tmp_path):
    study = _old_study(tmp_path)
    ok, dup, infeasible, oom = (record_of(t) for t in study.trials)
    assert ok.parallel_plan == _PLAN and ok.value == 1000.0 and ok.status == TrialStatus.OK
    assert ok.predicted["tokens_per_s"] == 900.0 and ok.measured["wall_s"] == 12.5
    assert ok.value_source == "measured" and ok.source == "cost model" and not ok.failed
    assert dup.is_duplicate and dup.duplicate_of == 0 and dup.predicted == {} and dup.value_source is None
    assert infeasible.plan is None and infeasible.key is None
    assert infeasible.reason.startswith("out of memory")
    assert oom.failed and oom.error.startswith("CUDA") and oom.shown_status == "oom"
    assert [t.number for t in top_trials(study, 5)] == [0]
    assert failed(study.trials) == {"oom: CUDA out of memory": 1}
    assert pruned(study.trials) == {"out of memory": 1}


def test_a_trial_without_a_status_shows_its_state():
    trial = create_trial(state=TrialState.FAIL, params={}, distributions={})
    record = record_of(trial)
    assert record.status is None and record.shown_status == "fail" and not record.failed


def test_what_search_writes_is_the_old_format():
    result = TrialResult(status=TrialStatus.OOM, error="out of memory", wall_s=3.0, tokens_per_s=None)
    assert outcome_attrs(result, measured=True) == {
        "status": "oom",
        "value_source": "measured",
        "measured": {"wall_s": 3.0},
        "error": "out of memory",
    }
    assert outcome_attrs(result, measured=False) == {
        "status": "oom",
        "value_source": "predicted",
        "error": "out of memory",
    }
    assert [a.value for a in Attr] == [
        "plan",
        "predicted",
        "measured",
        "status",
        "value_source",
        "error",
        "reason",
        "duplicate_of",
        "source",
    ]


def test_knobs_a_plan_ignores_do_not_make_another_plan():
    ctx = PlanContext(
        model=load_model("tiny"),
        cluster=make_cluster(num_gpus=2, gpu="cpu"),
        global_batch=8,
        seq_len=128,
        dp=None,
    )
    base = params_of(ParallelPlan(tp=1, pp=1, dp=2, micro_batch=1, global_batch=8, seq_len=128))
    gpipe, _ = plan_from_params({**base, "schedule": "gpipe"}, ctx)
    one_f_one_b, _ = plan_from_params({**base, "schedule": "1f1b"}, ctx)
    tp2, _ = plan_from_params({**base, "tp": 2}, ctx)
    assert plan_key(gpipe) == plan_key(one_f_one_b)  # the schedule does nothing at PP 1
    assert plan_key(tp2) != plan_key(gpipe)
