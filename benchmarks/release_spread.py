"""Same layout, another release: how far published runs of one layout spread across software releases.

NeMo / Megatron-Bridge and torchtitan republish their performance tables with each release. Where rows of
different releases share the model, GPU, GPU count, layout (TP, PP, VP, CP, EP, micro-batch, sequence),
precision, recompute, framework and the recipe features a plan cannot express, the cost model gives them one
prediction up to what it prices (fp8 recipe, speed knobs, global batch); what their measurements differ by
beyond the ratio of their predictions is software no plan field carries, and a floor under
the error of any model that reads only the plan. Used by ``modern_runs.py`` (dense) and ``moe_runs.py``
(MoE) to report that floor and to name it as the reason of a row beyond 30 % whose layout another release
ran near the prediction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

NEAR = 0.15
"""A release "ran the layout near the prediction" when its row is within this of it."""

_RELEASES = (
    re.compile(r"'(\d\d\.\d\d(?:\.\d\d)?) NeMo Container'|[Cc]ontainer NeMo (\d\d\.\d\d)|NeMo (\d\d\.\d\d)"),
    re.compile(r"\btorch ([0-9a-f]{7,})|\bpytorch ([\w.+]+)"),
    re.compile(r"commit ([0-9a-f]{7,})"),
)
"""Where a source names its release, most specific first: a NeMo container; the torch build; a commit."""
_LAYERS = re.compile(r"recompute_num_layers=(\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Member:
    """One published row of a same-layout group, with the model's prediction for it."""

    id: str
    release: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    """Rows of one layout published by at least two releases."""

    layout: str
    members: tuple[Member, ...]

    @property
    def unexplained(self) -> float:
        """Largest ratio between two releases' measurements beyond the ratio of their predictions, minus 1."""
        return max(
            (a.measured / b.measured) / (a.predicted / b.predicted) - 1
            for a in self.members
            for b in self.members
            if a.release != b.release
        )


def release(row: dict[str, Any]) -> str:
    """The software release a row's source names (a NeMo container, a torchtitan commit), else its source."""
    source = str(row.get("source", ""))
    for pattern in _RELEASES:
        m = pattern.search(source)
        if m:
            return next(v for v in m.groups() if v)
    return source


def layout_key(row: dict[str, Any], extra: Iterable[str] = ()) -> str:
    """The layout fields of a plan, and ``extra`` (recipe features a plan cannot express); not the fp8 recipe,
    the speed knobs or the global batch, which the prediction prices and ``Group.unexplained`` divides out."""
    shape = row.get("shape") or row.get("model_config") or {}
    read = {k: v for k, v in shape.items() if not k.endswith("_source")}
    model = row.get("model") or json.dumps(read, sort_keys=True)
    fields = (
        model,
        json.dumps(row["gpu"], sort_keys=True),
        row["num_gpus"],
        row.get("tp") or 1,
        row.get("pp") or 1,
        row.get("vp") or 1,
        row.get("cp") or 1,
        row.get("ep") or 1,
        row.get("micro_batch"),
        row.get("seq_len"),
        row.get("precision"),
        str(row.get("recompute") or "none").lower(),
        _LAYERS.findall(str(row.get("recompute_detail") or "")),
        row.get("framework"),
        sorted(extra),
    )
    return json.dumps(fields, default=str)


def groups(
    rows: list[dict[str, Any]],
    predicted: dict[str, float],
    measured: dict[str, float],
    extra: Callable[[dict[str, Any]], Iterable[str]] = lambda row: (),
) -> list[Group]:
    """Same-layout groups with members from at least two releases (rows without a prediction are left out)."""
    by_key: dict[str, list[Member]] = {}
    for row in rows:
        rid = str(row["id"])
        if rid in predicted and rid in measured:
            member = Member(id=rid, release=release(row), measured=measured[rid], predicted=predicted[rid])
            by_key.setdefault(layout_key(row, extra(row)), []).append(member)
    return [
        Group(layout=key, members=tuple(ms))
        for key, ms in by_key.items()
        if len({m.release for m in ms}) >= 2
    ]


def other_release_reason(rid: str, found: list[Group]) -> str:
    """For a row beyond 30 %: the row of another release that ran its layout within ``NEAR`` of the
    prediction, if one did, as the published reason; else empty."""
    for group in found:
        me = next((m for m in group.members if m.id == rid), None)
        if me is None:
            continue
        near = [m for m in group.members if m.release != me.release and abs(m.error) <= NEAR]
        if near:
            best = min(near, key=lambda m: abs(m.error))
            return (
                f"release {best.release} ran this layout at {best.measured:,.0f} tok/s/GPU ({best.id}, "
                f"{100 * best.error:+.0f}% from its prediction): a software difference no plan field carries"
            )
    return ""


def markdown(found: list[Group]) -> list[str]:
    """A section listing each group: its rows, releases, errors and the spread the plan does not explain."""
    if not found:
        return []
    lines = [
        "",
        "## Same layout, another release",
        "",
        "Rows of different software releases that share every plan field (`benchmarks/release_spread.py`). "
        "'Unexplained' is the largest ratio of two rows' measurements beyond the ratio of their predictions: "
        "a floor under the error of any model that reads only the plan.",
        "",
        "| rows (release: measured tok/s/GPU, error) | unexplained |",
        "|---|---|",
    ]
    for g in sorted(found, key=lambda g: -g.unexplained):
        cells = "; ".join(
            f"{m.id} ({m.release}: {m.measured:,.0f}, {100 * m.error:+.0f}%)" for m in g.members
        )
        lines.append(f"| {cells} | {100 * g.unexplained:.0f}% |")
    return lines
