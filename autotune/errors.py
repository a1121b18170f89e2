"""Typed errors. A user error is a ``ConfigError``: one line naming the field and the fix.

"Infeasible" (out of memory, too slow) is *not* an error: it is a value, ``Estimate.feasible``
with ``Estimate.reasons``. Errors are for input that cannot be interpreted at all.
"""

from __future__ import annotations

__all__ = ["AutotuneError", "ConfigError", "TrialError"]


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose. The CLI prints it on one line, exit 2."""


class ConfigError(AutotuneError, ValueError):
    """Bad user input: a flag, a model/cluster/space file, an impossible plan. One line, always: a control
    character the user put in a key or value (a YAML key with a newline) is shown escaped."""

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (args[0].translate(_ESCAPED), *args[1:])
        super().__init__(*args)


_ESCAPED = {c: repr(chr(c))[1:-1] for c in range(32)}
"""Control characters -> their Python escapes (``\\n``, ``\\t``, ``\\x00``)."""


class TrialError(AutotuneError):
    """A trial could not be launched or its result could not be read."""
