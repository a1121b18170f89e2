"""``torchrun``: each trial is a real ``torchrun`` subprocess running the PyTorch-native stack
(FSDP2 / DTensor TP / pipelining); see ``autotune.trials.runner`` for the contract. Its agents run where
the executor puts them (``autotune.executors``: this machine, N agents on loopback, or Slurm)."""

from __future__ import annotations

from autotune.executors import Executor, get_executor
from autotune.plan import Framework
from autotune.specs import ClusterSpec
from autotune.trials.request import ReportFn, TrialRequest
from autotune.trials.result import TrialResult, TrialStatus
from autotune.trials.runner import Launch, trial_config

__all__ = ["TorchrunBackend"]


class TorchrunBackend:
    name = "torchrun"
    measures = True
    framework = Framework.FSDP

    def __init__(
        self,
        *,
        device: str = "cuda",
        launch: Launch | None = None,
        executor: str | Executor = "local",
        **config_overrides: object,
    ) -> None:
        """``device``: ``cuda`` or ``cpu`` (gloo); ``launch``: torchrun's node/rendezvous settings;
        ``executor``: where the agents run (a name for ``get_executor``, which gets ``launch``);
        ``config_overrides``: ``TrialConfig`` fields (seed, lr, workload, script, ...) for every trial."""
        self.device = device
        self.launch = launch or Launch()
        self.executor = get_executor(executor, launch=self.launch) if isinstance(executor, str) else executor
        self.config_overrides = config_overrides

    def preflight(self, cluster: ClusterSpec) -> None:
        """A one-line ``ConfigError`` now when this node cannot start the trials (``autotune.preflight``)."""
        from autotune.preflight import check_trials_can_run

        check_trials_can_run(
            backend=self.name, device=self.device, executor=self.executor.name, cluster=cluster
        )

    def run(self, request: TrialRequest, report: ReportFn | None = None) -> TrialResult:
        if request.plan.framework is not self.framework:
            return TrialResult(
                status=TrialStatus.ERROR,
                wall_s=0.0,
                error=f"backend {self.name} runs framework {self.framework}, not {request.plan.framework}",
            )
        config = trial_config(request, device=self.device, **self.config_overrides)
        if config.script:  # the user's script reads the emitted configs (autotune.contract)
            from autotune.trials.script import write_script_configs

            write_script_configs(request.trial_dir, request.plan, request.model, request.cluster)
        return self.executor.run(request, config=config, report=report)
