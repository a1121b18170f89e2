"""The trials' pipeline step asks torch not to keep the last stage's outputs where torch can
(``autotune.trials.train._no_outputs``), which the memory model assumes (costmodel/pipebuffers.py)."""

from torch.distributed.pipelining import ScheduleGPipe, ScheduleInterleaved1F1B

from autotune.trials.train import _no_outputs


class _OldSchedule:
    def step(self, *args, target=None, losses=None, **kwargs):  # torch < 2.10: kwargs go to the model
        return None


def test_installed_torch_schedules_take_return_outputs():
    for cls in (ScheduleGPipe, ScheduleInterleaved1F1B):
        assert _no_outputs(cls.__new__(cls)) == {"return_outputs": False}, cls.__name__


def test_older_torch_gets_no_extra_keyword():
    assert _no_outputs(_OldSchedule()) == {}
