"""``autotune retune``: re-measure a study's best plans, search a little more, and say what changed.

Examples (``launchers/`` runs it nightly from cron, systemd, a Kubernetes CronJob or Slurm scrontab)::

    autotune retune --study 70b-16xh100-sxm --storage postgresql+psycopg2://autotune@db/autotune --budget 30m
    autotune retune --study s1 --budget 4 --threshold 0.05 --top 3

Each run re-measures the incumbent (the last record's best plan) and the study's top-K on the study's own
backend, queues the best plans of the history (a warm start for Optuna), runs new trials within
``--budget``, and appends one record to ``runs/<study>/history.jsonl`` (``autotune.retune``).

Exit codes: 0 stable, first record, or improvement (new launch files in ``best/``, the previous ones in
``best.prev/``, and the plan diff printed); 3 regression: the last best plan is slower beyond its measured
noise by more than ``--threshold``, or fails, with the suspected cause -- a suspected regression is measured
once more first and the better measurement counts, so one busy moment on the node is not an alarm;
1 nothing could be measured; 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autotune.cli.worker import add_study_args
from autotune.join import join_study
from autotune.plan import ParallelPlan

__all__ = ["RetuneCommand"]

_REGRESSION = 3


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1), got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


class RetuneCommand:
    help = "Re-measure a study's best plans, try new ones within a budget, and flag regressions (exit 3)."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_study_args(p)
        g = p.add_argument_group("retune")
        g.add_argument(
            "--budget",
            default="4",
            help="new trials: a count (4, the default) or a wall-clock "
            "budget for the whole run (90s, 30m, 2h)",
        )
        g.add_argument(
            "--threshold",
            type=_fraction,
            default=0.05,
            help="a slowdown beyond the measured "
            "noise larger than this fraction is a regression (default 0.05)",
        )
        g.add_argument(
            "--top",
            type=_count,
            default=3,
            metavar="K",
            help="plans re-measured besides the incumbent (default 3)",
        )
        g.add_argument("--json", action="store_true", help="print the history record")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.remeasure import act, new_trials, remeasure, to_remeasure
        from autotune.retune import (
            append_history,
            compare,
            environment,
            parse_budget,
            read_history,
            record_of,
        )

        n_trials, budget_s = parse_budget(args.budget)
        start = time.monotonic()
        joined = join_study(args.study, args.storage, Path(args.out), heartbeat_s=args.heartbeat)
        history_path = joined.study_dir.root / "history.jsonl"
        history = read_history(history_path)
        last = history[-1] if history else None
        date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        env = environment()
        run_dir = joined.study_dir.root / "retune" / date.replace(":", "")
        plans = to_remeasure(joined.study, last, args.top)
        remeasured = [remeasure(joined, plan, run_dir / f"{i:02d}", date) for i, plan in enumerate(plans)]
        launched, new = new_trials(
            joined,
            history,
            args.top,
            n_trials,
            budget_s,
            start,
            log=lambda line: print(line, file=sys.stderr),
        )
        incumbent = remeasured[0] if remeasured else None
        measured = [m for m in remeasured + new if m.ok]
        best = max(measured, key=lambda m: m.tokens_per_s) if measured else incumbent
        if best is None or (last is None and not best.ok):
            print(
                f"autotune retune: nothing measured in study '{args.study}' (no finished trial to "
                f"re-measure, no new trial succeeded); see {run_dir}, {joined.study_dir.trials}",
                file=sys.stderr,
            )
            return 1
        verdict = compare(last, incumbent, best, env, args.threshold)
        if verdict.kind == "regression" and incumbent is not None:  # rule out a transient (a busy node)
            again = remeasure(joined, ParallelPlan.from_dict(incumbent.plan), run_dir / "00-confirm", date)
            remeasured.append(again)
            incumbent = max((incumbent, again), key=lambda m: (m.ok, m.tokens_per_s or 0.0))
            ok = [m for m in remeasured + new if m.ok] or [incumbent]
            best = max(ok, key=lambda m: m.tokens_per_s or 0.0)
            verdict = compare(last, incumbent, best, env, args.threshold)
        emitted = act(joined, verdict.kind, best)
        record = record_of(
            date=date,
            study=args.study,
            backend=joined.setup["backend"],
            environment=env,
            threshold=args.threshold,
            budget=args.budget,
            best=best,
            incumbent=incumbent,
            remeasured=remeasured,
            new_trials=launched,
            verdict=verdict.kind,
            change=verdict.change,
            noise_band=verdict.noise_band,
            cause=verdict.cause,
            message=verdict.message,
        )
        append_history(history_path, record)
        if args.json:
            print(json.dumps(record, indent=2))
        else:
            print(_report(record, last, emitted, history_path, len(history) + 1))
        if verdict.kind == "regression":
            print(
                f"autotune retune: REGRESSION in study '{args.study}': {verdict.message}; suspected cause: "
                f"{verdict.cause}",
                file=sys.stderr,
            )
            return _REGRESSION
        return 0


def _report(
    record: dict[str, Any], last: dict[str, Any] | None, emitted: list[Path], history: Path, num_records: int
) -> str:
    from autotune.retune import plan_diff

    best, env = record["best"], record["environment"]
    lines = [
        f"retune    {record['study']} at {record['date']} on {env['hostname']} ({record['backend']}; "
        f"{env['gpu_count']} x {env['gpu_name']})",
        f"measured  {len(record['remeasured'])} plan(s) again, {record['new_trials']} new trial(s)",
    ]
    lines += [
        f"  {m['summary']}: "
        + (
            f"{m['tokens_per_s']:,.0f} tokens/s, noise {m['noise_cov']:.1%}"
            if m["status"] == "ok"
            else f"{m['status']}: {m['error']}"
        )
        for m in record["remeasured"]
    ]
    how = "predicted (simulate)" if record["backend"] == "simulate" else "measured"
    lines.append(
        f"best      {best['summary']}: {best['tokens_per_s'] or 0:,.0f} tokens/s {how}, "
        f"{best['predicted_tokens_per_s'] or 0:,.0f} predicted, noise {best['noise_cov']:.1%}"
    )
    lines.append(f"verdict   {record['verdict']}: {record['message']}")
    if record["cause"]:
        lines.append(f"cause     {record['cause']}")
    if record["verdict"] == "improvement" and last is not None:
        lines += ["plan diff"] + [f"  {d}" for d in plan_diff(last["best"]["plan"], best["plan"])]
    if emitted:
        prev = emitted[0].parent.with_name("best.prev")
        lines.append(
            f"emitted   {len(emitted)} file(s) in {emitted[0].parent}"
            + (f" (the previous ones in {prev})" if prev.exists() else "")
        )
    lines.append(f"history   {history} ({num_records} records)")
    return "\n".join(lines)
