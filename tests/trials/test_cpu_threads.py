"""Tier 0: CPU trial ranks split the cores instead of each taking all of them."""

from __future__ import annotations

import os

import pytest
import torch

from autotune.trials.cpu import CPU_AFFINITY_ENV, cpu_share
from autotune.trials.worker import pin_cpu_threads


@pytest.mark.parametrize(
    ("cores", "ranks", "single_node", "expected"),
    [
        (2, 1, True, (1, True)),  # a spare core: leave it to the launcher, pin the rank
        (16, 4, True, (3, True)),  # (16 - 1) // 4 cores each, one left over at least
        (2, 2, True, (1, False)),  # no spare core: one thread each, unpinned (gloo threads share it)
        (2, 4, True, (1, False)),  # oversubscribed
        (8, 2, False, (4, False)),  # agents of a multi-node job may share a host: never pin
    ],
)
def test_cpu_share(cores, ranks, single_node, expected):
    assert cpu_share(cores, ranks, single_node=single_node) == expected


def test_each_local_rank_gets_its_share_of_the_cores(monkeypatch):
    before, allowed = torch.get_num_threads(), os.sched_getaffinity(0)
    cores = len(allowed)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv(CPU_AFFINITY_ENV, "0")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))  # more ranks than cores: one thread each
        monkeypatch.setenv("WORLD_SIZE", str(cores * 2))
        assert pin_cpu_threads() == 1 == torch.get_num_threads()
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        monkeypatch.setenv("WORLD_SIZE", "1")
        assert pin_cpu_threads() == cpu_share(cores, 1)[0]
        assert os.sched_getaffinity(0) == allowed  # pinning forced off
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit setting wins
        assert pin_cpu_threads() == 1
    finally:
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(before)


def test_a_rank_with_a_spare_core_is_pinned_to_its_own(monkeypatch):
    before, allowed = torch.get_num_threads(), os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("needs 2 cores")
    try:
        for name in ("OMP_NUM_THREADS", CPU_AFFINITY_ENV):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        monkeypatch.setenv("WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_RANK", "0")
        threads = pin_cpu_threads()
        assert threads == len(os.sched_getaffinity(0)) == (len(allowed) - 1)
        assert os.sched_getaffinity(0) < allowed
    finally:
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(before)
