"""Multi-node trials on one machine: torchrun agents on 127.0.0.1 joined by the c10d rendezvous.

Two agents (``--nnodes 2``, one worker each) form one 2-node trial of the tiny model and measure it; a
lone agent of a 2-node trial gives up after its join timeout and the trial is a ``rendezvous_error``,
well inside 30 s, with no process left behind.
"""

from __future__ import annotations

import shlex
import time

import pytest
from torch.distributed.run import config_from_args, get_args_parser
from trial_requests import PLAN, assert_nothing_left, make_request

from autotune.executors import get_executor
from autotune.executors.multinode import MultiNodeExecutor
from autotune.trials.result import TrialStatus
from autotune.trials.runner import trial_config


@pytest.mark.dist(timeout=120)
def test_two_agents_on_loopback_form_one_two_node_trial(tmp_path):
    request = make_request(PLAN, tmp_path / "two-nodes", num_nodes=2)
    executor = get_executor("multinode")
    result = executor.run(request, config=trial_config(request, device="cpu"))
    assert result.status is TrialStatus.OK, result.error
    assert result.tokens_per_s > 0 and result.extra["world_size"] == 2
    agents = [shlex.split(line) for line in (request.trial_dir / "cmd.txt").read_text().splitlines()]
    assert len(agents) == 2
    endpoints = set()
    for argv in agents:
        args = get_args_parser().parse_args(argv[3:])  # after "python -m torch.distributed.run"
        config, _, _ = config_from_args(args)
        assert (config.min_nodes, config.nproc_per_node, args.standalone) == (2, 1, False)
        endpoints.add((config.rdzv_endpoint, config.run_id))
    ((endpoint, _),) = endpoints  # both agents join the same rendezvous
    assert endpoint.startswith("127.0.0.1:")
    assert sorted(p.name for p in request.trial_dir.glob("joined.*")) == ["joined.0", "joined.1"]
    assert_nothing_left(request.trial_dir)


@pytest.mark.dist(timeout=60)
def test_lone_agent_is_a_rendezvous_error_within_bounds(tmp_path):
    request = make_request(PLAN, tmp_path / "lone", num_nodes=2, timeout_s=60)
    executor = MultiNodeExecutor(node_ranks=[0], join_timeout_s=8)  # the other node never comes
    start = time.monotonic()
    result = executor.run(request, config=trial_config(request, device="cpu"))
    elapsed = time.monotonic() - start
    assert result.status is TrialStatus.RENDEZVOUS_ERROR, result.error
    assert result.error.startswith("no worker started")
    assert 8 <= elapsed < 90  # the join timeout, then a stop: a hang would be far longer
    assert not list(request.trial_dir.glob("started.*"))
    assert_nothing_left(request.trial_dir)


def test_a_world_that_does_not_split_over_the_nodes_is_an_error_without_a_launch(tmp_path):
    request = make_request(PLAN, tmp_path / "odd")
    result = MultiNodeExecutor(nnodes=3).run(request, config=trial_config(request, device="cpu"))
    assert result.status is TrialStatus.ERROR and "does not split over 3 node(s)" in result.error
    assert not request.trial_dir.exists()
