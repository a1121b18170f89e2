"""``torchrun``: each trial is a real ``torchrun`` subprocess running the PyTorch-native stack
(FSDP2 / DTensor TP / pipelining); see ``autotune.trials.runner`` for the contract."""

from __future__ import annotations

from autotune.backends.base import ReportFn, TrialRequest
from autotune.plan import Framework
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import Launch, run_trial, trial_config

__all__ = ["TorchrunBackend"]


class TorchrunBackend:
    name = "torchrun"
    measures = True
    framework = Framework.FSDP

    def __init__(self, *, device: str = "cuda", launch: Launch | None = None,
                 **config_overrides: object) -> None:
        """``device``: ``cuda`` or ``cpu`` (gloo); ``launch``: torchrun's node/rendezvous settings;
        ``config_overrides``: ``TrialConfig`` fields (seed, lr, ...) for every trial."""
        self.device = device
        self.launch = launch or Launch()
        self.config_overrides = config_overrides

    def run(self, request: TrialRequest, report: ReportFn | None = None) -> TrialResult:
        if request.plan.framework is not self.framework:
            return TrialResult(status=TrialStatus.ERROR, wall_s=0.0,
                               error=f"backend {self.name} runs framework {self.framework}, "
                                     f"not {request.plan.framework}")
        config = trial_config(request, device=self.device, **self.config_overrides)
        return run_trial(request, report=report, launch=self.launch, config=config)
