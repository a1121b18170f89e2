"""Tier 0: CPU trial ranks split the cores instead of each taking all of them."""

from __future__ import annotations

import os

import torch

from autotune.trials.worker import pin_cpu_threads


def test_each_local_rank_gets_its_share_of_the_cores(monkeypatch):
    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 2))  # more ranks than cores: one thread each
        assert pin_cpu_threads() == 1 == torch.get_num_threads()
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert pin_cpu_threads() == cores
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit setting wins
        assert pin_cpu_threads() == 1
    finally:
        torch.set_num_threads(before)
