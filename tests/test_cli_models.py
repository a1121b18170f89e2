"""``autotune models``: every preset ``--model`` takes, what autotune reads from it, and its source."""

from __future__ import annotations

import json

from autotune.catalog import model_names
from autotune.cli import main


def test_every_preset_is_listed_with_its_counts_and_source(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert all(f"\n{name} " in f"\n{text}" for name in model_names())
    assert "mixtral-8x22b" in text and "140.6B total, 39.2B active" in text
    assert "mistralai/Mixtral-8x22B-v0.1 config.json" in text


def test_json_lists_what_estimate_reads_and_a_bad_name_gets_the_closest(capsys):
    assert main(["models", "gpt-oss-20b", "llama3.1-70b", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["gpt-oss-20b", "llama3.1-70b"]
    assert rows[0]["total_params"] > rows[0]["active_params"] and rows[0]["source"].startswith("openai/")
    assert main(["models", "gpt-oss-12b"]) == 2
    err = capsys.readouterr().err
    assert "NAME: unknown model 'gpt-oss-12b' (did you mean gpt-oss-120b or gpt-oss-20b?)" in err
