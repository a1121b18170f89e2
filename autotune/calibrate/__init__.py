"""Calibrate the cost model from real trials: fit its documented efficiency factors to measured step times.

``fit`` (pure: plans and measured times in, ``Factors`` and fidelity out), ``study`` (a study's trials in,
``calibration.yaml`` and the summary's ``calibration`` block out) and ``online`` (``Refiner``: recalibrate
after every trial of a search and pick the next plan). scipy is imported only when fitting.
"""

from autotune.calibrate.fit import Factors, Fidelity, FitResult, Observation, fidelity, fit, kendall_tau
from autotune.calibrate.online import Refiner
from autotune.calibrate.study import MIN_TRIALS, calibrate_study, calibration_block, observations

__all__ = [
    "Factors",
    "FitResult",
    "Fidelity",
    "Observation",
    "fidelity",
    "fit",
    "kendall_tau",
    "MIN_TRIALS",
    "calibrate_study",
    "calibration_block",
    "observations",
    "Refiner",
]
