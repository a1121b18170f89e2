"""Same-layout rows of different releases (benchmarks/release_spread.py): what groups, what the spread is."""

import pytest

from benchmarks import modern_runs
from benchmarks import release_spread as rs


def _row(rid: str, source: str, **layout) -> dict:
    base = {
        "id": rid,
        "source": source,
        "model": "llama3-8b",
        "gpu": "b200",
        "num_gpus": 8,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "micro_batch": 2,
        "seq_len": 8192,
        "precision": "fp8",
        "recompute": None,
        "framework": "megatron",
    }
    return base | layout


@pytest.mark.parametrize(
    ("source", "release"),
    [
        ("Megatron-Bridge summary, '25.11 NeMo Container' pre-training table", "25.11"),
        ("Megatron-Bridge summary (repo commit 067f987df), '26.04.01 NeMo Container' table", "26.04.01"),
        ("NVIDIA NeMo Framework Performance Summary, container NeMo 25.02, System DGX-B200", "25.02"),
        ("torchtitan benchmarks/x.md (torch 1963fc8 2024-12-23, torchao eab345c)", "1963fc8"),
    ],
)
def test_release_is_read_from_the_source(source, release):
    assert rs.release({"source": source}) == release


def test_rows_of_one_layout_from_two_releases_form_a_group():
    old = _row("old", "container NeMo 25.02", fp8_recipe=None, global_batch=128)
    new = _row("new", "'25.11 NeMo Container'", fp8_recipe="current", recompute="none", global_batch=64)
    same_release = _row("same", "'25.11 NeMo Container'", fp8_recipe="mxfp8")
    other_layout = _row("tp2", "'26.02 NeMo Container'", tp=2)
    rows = [old, new, same_release, other_layout]
    measured = {"old": 26000.0, "new": 30600.0, "same": 29500.0, "tp2": 20000.0}
    predicted = {"old": 35000.0, "new": 34000.0, "same": 33800.0, "tp2": 30000.0}
    (group,) = rs.groups(rows, predicted, measured)
    assert {m.id for m in group.members} == {"old", "new", "same"}
    # across releases only, the predictions' own ratio divided out: (30600/26000) / (34000/35000)
    assert group.unexplained == pytest.approx(30600 / 26000 / (34000 / 35000) - 1)


def test_a_recipe_feature_the_plan_cannot_express_splits_groups():
    a = _row("a", "'25.09 NeMo Container'")
    b = _row("b", "'25.11 NeMo Container'")
    feats = {"a": ["token drop"], "b": []}
    assert rs.groups([a, b], {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 2.0}, extra=lambda r: feats[r["id"]]) == []


def test_the_reason_names_a_release_that_ran_the_layout_near_the_prediction():
    rows = [_row("old", "container NeMo 25.02"), _row("new", "'25.11 NeMo Container'")]
    found = rs.groups(rows, {"old": 35000.0, "new": 34000.0}, {"old": 26000.0, "new": 30600.0})
    reason = rs.other_release_reason("old", found)
    assert "release 25.11" in reason and "30,600" in reason and "+11%" in reason
    # the newer row is within 15 % itself, and the older one is no evidence for it
    assert rs.other_release_reason("new", found) == ""
    far = rs.groups(rows, {"old": 35000.0, "new": 40000.0}, {"old": 26000.0, "new": 30600.0})
    assert rs.other_release_reason("old", far) == ""


def test_nemo_25_02_b200_8b_is_named_by_the_25_11_row():
    rows, _ = modern_runs.load_rows()
    outcomes = [modern_runs.predict_row(row) for row in rows]
    modern_runs.name_other_releases(rows, outcomes)
    reason = next(o.reason for o in outcomes if o.id == "nemo-2502-llama3-8b-b200-8g-fp8")
    assert reason.startswith("release 25.11 ran this layout")
