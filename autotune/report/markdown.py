"""``report.md``: the same report as Markdown, with the figures as PNG files next to it."""

from __future__ import annotations

from autotune.report.data import ReportData
from autotune.report.tables import (
    FIGURES,
    Table,
    dashboard_hint,
    error_text,
    facts,
    headline,
    pruned_tables,
    top_table,
)

__all__ = ["render_markdown"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> list[str]:
    lines = [f"## {t.title}", "", "| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return lines + (["", f"_{t.note}_"] if t.note else []) + [""]


def render_markdown(data: ReportData, files: dict[str, str], missing: dict[str, str], top: int) -> str:
    lines = [f"# autotune report: {data.study}", ""]
    lines += [f"- **{k}**: {_cell(v)}" for k, v in facts(data)]
    lines += ["", f"**{headline(data)}**", ""]
    lines += _table(top_table(data, top))
    for key, title, caption in FIGURES:
        lines += [f"## {title}", ""]
        if key == "error":
            lines += [error_text(data), ""]
        name = files.get(key)
        lines += (
            [f"![{title}]({name})", "", f"_{caption}_", ""]
            if name
            else [f"_Not shown: {missing.get(key, 'no data')}_", ""]
        )
    for t in pruned_tables(data):
        lines += _table(t)
    lines += ["## Open the study", "", f"`{dashboard_hint(data)}`", ""]
    return "\n".join(lines)
