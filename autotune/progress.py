"""Live progress for ``autotune search``: rich bars on stderr, only when stderr is a terminal.

Two bars: the cost model ranking the space (plans estimated, how many fit), then the trials (launched of
planned, the current best, a tally of trial statuses). Off a terminal (CI logs, pipes) and with ``--quiet``
nothing is drawn, so logs stay line-oriented and ``--json`` output stays one object.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import IO, Any

from autotune.trialrecord import record_of

__all__ = ["SearchProgress", "wants_progress"]


def wants_progress(stream: IO[str] | None = None, *, quiet: bool = False) -> bool:
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return not quiet and bool(isatty and isatty())


class SearchProgress:
    """A context manager; every method is a no-op when it is disabled (or outside the ``with``)."""

    def __init__(self, *, enabled: bool, stream: IO[str] | None = None) -> None:
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self._progress: Any = None
        self._rank_task: Any = None
        self._trial_task: Any = None
        self._estimated = self._fit = 0

    def __enter__(self) -> SearchProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            console = Console(file=self._stream, force_terminal=True)
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
                console=console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # ------------------------------------------------------------------------------------------ ranking
    def ladder_judged(self, estimated: int, fit: int) -> None:
        """One micro-batch ladder of the ranking judged (``ranking.LadderJudged``): ``estimated`` plans,
        ``fit`` of them within the memory headroom. A callback, not a wrapped estimator, so that the ranking
        keeps its worker processes (``autotune.rankworkers``)."""
        if not self.enabled:
            return
        before = self._estimated
        self._estimated += estimated
        self._fit += fit
        if before == 0 or self._estimated // 64 != before // 64:
            self._update_rank()

    def _update_rank(self) -> None:
        if self._progress is None:
            return
        info = f"{self._fit:,} fit"
        if self._rank_task is None:
            self._rank_task = self._progress.add_task("ranking plans (cost model)", total=None, info=info)
        self._progress.update(self._rank_task, completed=self._estimated, info=info)

    def ranked(self, num_feasible: int) -> None:
        if self._progress is not None:
            self._update_rank()
            self._progress.update(
                self._rank_task,
                total=self._estimated,
                completed=self._estimated,
                info=f"{num_feasible:,} fit",
            )

    # ------------------------------------------------------------------------------------------ trials
    def start_trials(self, total: int) -> None:
        if self._progress is not None:
            self._trial_task = self._progress.add_task("trials", total=total, info="")

    def note(self, line: str) -> None:
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)

    def trial_done(self, line: str, study: Any) -> None:
        """After a launched trial: print its line above the bars, advance, refresh the best and the tally."""
        if self._progress is None:
            return
        from autotune.search import top_trials

        self.note(line)
        trials = study.get_trials(deepcopy=False)
        statuses = Counter(record_of(t).shown_status for t in trials)
        best = next(iter(top_trials(study, 1)), None)
        info = " ".join(f"{s}:{n}" for s, n in statuses.most_common())
        if best is not None:
            info = f"best {best.value:,.0f} tok/s (trial {best.number})  {info}"
        self._progress.update(self._trial_task, advance=1, info=info)
