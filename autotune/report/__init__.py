"""``autotune report``: a study's answer as a self-contained HTML page and a Markdown file with figures.

``collect`` reads the study (``data.py``); ``write_report`` draws the figures (``plots.py``, matplotlib Agg,
PNG) and writes ``report/index.html`` (figures embedded as base64, no network references) and
``report/report.md`` (figures next to it as PNG files).
"""

from autotune.report.data import (
    MEMORY_GROUPS,
    TIME_GROUPS,
    PlanRow,
    ReportData,
    collect,
    kendall_tau,
    memory_groups,
    pareto_front,
    time_groups,
)
from autotune.report.writer import write_report

__all__ = [
    "collect",
    "write_report",
    "ReportData",
    "PlanRow",
    "kendall_tau",
    "pareto_front",
    "TIME_GROUPS",
    "MEMORY_GROUPS",
    "time_groups",
    "memory_groups",
]
