"""``autotune report STUDY``: the study's answer as ``runs/<study>/report/index.html`` and ``report.md``.

Examples::

    autotune report 70b-16xh100-sxm                       # reads runs/70b-16xh100-sxm/
    autotune report s1 --out /data/runs --price-per-gpu-hour 2.5
    autotune report s1 --json                             # the numbers behind the page, one JSON object
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.cli._args import positive_float
from autotune.errors import ConfigError
from autotune.userfile import writable_dir

__all__ = ["ReportCommand"]


def _price(text: str) -> float:
    return positive_float(text, "a positive price in dollars")


class ReportCommand:
    help = "Write a study's report: top plans, breakdowns, Pareto front, history, importances, model error."

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("study", metavar="STUDY", help="study name (a directory under --out)")
        p.add_argument("--out", default="runs", metavar="DIR", help="runs directory (default ./runs)")
        p.add_argument(
            "--top", type=int, default=8, metavar="K", help="plans in the table and bars (default 8)"
        )
        p.add_argument(
            "--price-per-gpu-hour",
            type=_price,
            metavar="USD",
            help="adds $ per million tokens to the table and the Pareto front",
        )
        p.add_argument("--json", action="store_true", help="print one JSON object (the report's numbers)")

    def run(self, args: argparse.Namespace) -> int:
        from autotune.report import collect, write_report

        if args.top < 1:
            raise ConfigError(f"--top: expected 1 or more, got {args.top}")
        study_dir = Path(args.out) / args.study
        if not study_dir.is_dir():
            raise ConfigError(
                f"no study '{args.study}' under {args.out}/ (pass --out DIR where the search wrote it)"
            )
        data = collect(study_dir, price_per_gpu_hour=args.price_per_gpu_hour)
        files = write_report(data, writable_dir(study_dir / "report", "--out"), top=args.top)
        if args.json:
            print(json.dumps({**data.to_dict(top=args.top), "files": [str(f) for f in files]}, indent=2))
        else:
            print(files[0])
            print(files[1])
        return 0
