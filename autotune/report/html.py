"""``index.html``: one self-contained page. Figures are embedded as base64 PNG ``data:`` URIs, the style sheet
is inline, and nothing references the network (no scripts, fonts or links), so it opens offline and can be
mailed or archived as one file."""

from __future__ import annotations

import base64
from html import escape

from autotune import __version__
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

__all__ = ["render_html"]

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1280px;
       color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.15em; margin-top: 28px;
       border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.answer { background: #eef5ee; border-left: 4px solid #55a868; padding: 10px 14px; font-size: 1.05em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 8px 0; }
dt { font-weight: 600; } dd { margin: 0; }
figure { margin: 12px 0 20px; } figcaption { color: #555; font-size: 0.85em; max-width: 900px; }
img { max-width: 100%; border: 1px solid #eee; }
.grid { display: flex; flex-wrap: wrap; gap: 0 24px; align-items: flex-start; }
code { background: #f4f4f4; padding: 1px 4px; } .muted { color: #777; font-size: 0.85em; }
"""


def _table(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{escape(c)}</td>'
            if c[:1].isdigit() or c[:1] in "+-"
            else f"<td>{escape(c)}</td>"
            for c in row
        )
        + "</tr>"
        for row in t.rows
    )
    note = f'<p class="muted">{escape(t.note)}</p>' if t.note else ""
    return f"<h2>{escape(t.title)}</h2><table><tr>{head}</tr>{body}</table>{note}"


def _figure(key: str, title: str, caption: str, image: bytes | None, missing: str) -> str:
    if image is None:
        return f'<figure><h3>{escape(title)}</h3><p class="muted">Not shown: {escape(missing)}</p></figure>'
    src = "data:image/png;base64," + base64.b64encode(image).decode("ascii")
    return (
        f'<figure id="{key}"><h3>{escape(title)}</h3><img alt="{escape(title)}" src="{src}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def render_html(data: ReportData, figures: dict[str, bytes | None], missing: dict[str, str], top: int) -> str:
    facts_html = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts(data))
    figs = {
        key: _figure(key, title, caption, figures.get(key), missing.get(key, "no data"))
        for key, title, caption in FIGURES
    }
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>autotune report: {escape(data.study)}</title><style>{_CSS}</style></head><body>",
        f"<h1>autotune report: {escape(data.study)}</h1>",
        f"<dl>{facts_html}</dl>",
        f'<p class="answer">{escape(headline(data))}</p>',
        _table(top_table(data, top)),
        "<h2>Breakdowns of the top plans</h2>",
        figs["step_time"],
        figs["memory"],
        "<h2>Trade-offs and the search</h2>",
        figs["pareto"],
        f'<div class="grid">{figs["history"]}{figs["importance"]}</div>',
        "<h2>Cost model error on this cluster</h2>",
        f"<p>{escape(error_text(data))}</p>",
        figs["error"],
        *(_table(t) for t in pruned_tables(data)),
        "<h2>Open the study</h2>",
        f"<p>The study is a plain Optuna study: <code>{escape(dashboard_hint(data))}</code></p>",
        f'<p class="muted">autotune {escape(__version__)}</p>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
