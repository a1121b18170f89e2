"""The types ranking workers send back pickle by their field values and come back equal."""

import copy
import dataclasses
import pickle

from autotune.catalog import load_model, make_cluster
from autotune.costmodel import estimate
from autotune.pickled import by_values
from autotune.plan import ParallelPlan, Schedule


def test_an_estimate_comes_back_equal_with_its_plan_memory_and_time():
    model, cluster = load_model("7b"), make_cluster(num_gpus=8, gpu="h100-sxm")
    layout = {"tp": 2, "pp": 2, "dp": 2, "schedule": Schedule.INTERLEAVED, "virtual_stages": 2}
    plan = ParallelPlan(**layout, global_batch=16, seq_len=4096)
    est = estimate(model, cluster, plan)
    back = pickle.loads(pickle.dumps(est))
    assert back == est and back.plan == plan and hash(back.plan) == hash(plan)
    assert back.memory == est.memory and back.time == est.time and back.tokens_per_s == est.tokens_per_s
    assert copy.deepcopy(est) == est
    assert type(est).__getstate__(est) == tuple(getattr(est, f) for f in type(est).__dataclass_fields__)


@by_values
@dataclasses.dataclass(frozen=True, slots=True)
class _One:
    x: int


def test_a_class_of_one_field_keeps_its_value():
    assert pickle.loads(pickle.dumps(_One(3))) == _One(3)
