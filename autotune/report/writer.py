"""Draw the figures a ``ReportData`` supports and write ``index.html``, ``report.md`` and the PNGs."""

from __future__ import annotations

from pathlib import Path

from autotune.report.data import ReportData

__all__ = ["figures", "write_report"]


def figures(data: ReportData, top: int) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """PNG bytes per figure key, and why a figure is missing (no data for it yet)."""
    from autotune.report import plots

    rows = data.top(top)
    out: dict[str, bytes | None] = dict.fromkeys(
        ("step_time", "memory", "pareto", "history", "importance", "error")
    )
    missing: dict[str, str] = {}
    if rows:
        out["step_time"], out["memory"] = plots.step_time_png(rows), plots.memory_png(rows)
        out["pareto"] = plots.pareto_png(data.rows, data.pareto)
        out["history"] = plots.history_png(data.history)
    else:
        missing.update(
            dict.fromkeys(("step_time", "memory", "pareto", "history"), "no finished feasible trial")
        )
    if data.importances:
        out["importance"] = plots.importance_png(data.importances)
    else:
        missing["importance"] = data.importance_note
    if data.error is not None:
        out["error"] = plots.error_png(data.error)
    else:
        missing["error"] = "no measured trial in this study (run the search where the GPUs are)"
    return out, missing


def write_report(data: ReportData, out_dir: Path, *, top: int = 8) -> list[Path]:
    """Write the report into ``out_dir`` (created); returns the files written, ``index.html`` first."""
    from autotune.report.html import render_html
    from autotune.report.markdown import render_markdown

    out_dir.mkdir(parents=True, exist_ok=True)
    images, missing = figures(data, top)
    written, files = [], {}
    for key, image in images.items():
        if image is not None:
            path = out_dir / f"{key}.png"
            path.write_bytes(image)
            files[key] = path.name
            written.append(path)
    html = out_dir / "index.html"
    html.write_text(render_html(data, images, missing, top))
    md = out_dir / "report.md"
    md.write_text(render_markdown(data, files, missing, top))
    return [html, md, *written]
