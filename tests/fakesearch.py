"""A known landscape for search tests: a fake cost model and a backend that records what it runs.

The fake cost model (``fake_memory``/``fake_step_time``): memory grows with the micro-batch and shrinks with
TP, PP, sharding and recompute, and a throughput with one best plan.
"""

from autotune.catalog import load_model, make_cluster
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.memory import MemoryBreakdown
from autotune.costmodel.steptime import TimeBreakdown
from autotune.ranking import plan_search
from autotune.space import load_space
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


def fake_ranking(model="13b", gpus=8, space=None, **kw):
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
