"""How a trial is run: the search calls a Backend and gets a TrialResult back."""

from autotune.backends.base import Backend

__all__ = ["Backend"]
