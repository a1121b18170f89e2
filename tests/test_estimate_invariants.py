"""Laws the estimate must obey (benchmarks/estimate_invariants.py), on a small fixed sample: the MoE models,
where a host-bound layer, the experts' activation offload and expert parallelism meet."""

import pytest

from benchmarks.estimate_invariants import sample, violations

MODELS = ["qwen3-30b-a3b", "ernie-4.5-21b-a3b", "gpt-oss-120b", "deepseek-v2-lite"]


@pytest.mark.parametrize("model", MODELS)
def test_no_sampled_plan_breaks_a_law(model):
    broken = [
        f"{law}: {plan} {what}"
        for m, cluster, plan in sample(seed=0, plans_per_space=3, models=[model])
        for law, what in violations(m, cluster, plan)
    ]
    assert not broken, broken[:3]
