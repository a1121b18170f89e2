"""Progress bars appear on a terminal only: CI logs and `--json` stay clean; `--quiet` silences them."""

import io
import json

import pytest

from autotune import rankworkers
from autotune.cli import main
from autotune.costmodel import estimate
from autotune.progress import SearchProgress, wants_progress

_ARGV = ["search", "--model", "7b", "--gpus", "8", "--global-batch", "64", "--top", "2", "--trials", "3"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_wants_progress_only_on_a_terminal_and_not_quiet():
    assert wants_progress(_Terminal()) is True
    assert wants_progress(io.StringIO()) is False
    assert wants_progress(_Terminal(), quiet=True) is False


def test_a_disabled_progress_is_a_no_op():
    stream = _Terminal()
    with SearchProgress(enabled=False, stream=stream) as progress:
        progress.ranked(3)
        progress.start_trials(2)
        progress.note("hello")
    assert stream.getvalue() == ""


@pytest.mark.slow
def test_off_a_terminal_search_prints_no_bars_and_json_stays_one_object(tmp_path, capsys):
    assert main([*_ARGV, "--out", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    assert "\x1b[" not in err and "ranking plans" not in err


@pytest.mark.slow
def test_on_a_terminal_search_draws_ranking_and_trial_bars_with_the_best(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("autotune.cli.search.wants_progress", lambda quiet=False: not quiet)
    given = []  # the estimator the ranking judges with: the catalog's, which forks workers on large spaces
    real_judged = rankworkers.judged_space

    def spy(choices, ctx, tally, est, variants=None, **kw):
        given.append(est)
        return real_judged(choices, ctx, tally, est, variants, **kw)

    monkeypatch.setattr("autotune.ranking.judged_space", spy)
    assert main([*_ARGV, "--out", str(tmp_path), "--json"]) == 0
    assert given and all(e is estimate for e in given)
    out, err = capsys.readouterr()
    trials = json.loads(out)["trials"]
    assert trials["launched_this_run"] == 3  # stdout untouched by the bars
    # the bar counts the study's trials: a proposal that is a measured plan again counts ok without a launch
    assert trials["ok"] >= 3 and f"ok:{trials['ok']}" in err and f"infeasible:{trials['infeasible']}" in err
    assert "ranking plans (cost model)" in err and "trials" in err and "best " in err
    assert "trial 0: " in err  # each launched trial's line, printed above the bars


@pytest.mark.slow
def test_quiet_silences_the_bars_on_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("autotune.cli.search.wants_progress", lambda quiet=False: not quiet)
    assert main([*_ARGV, "--out", str(tmp_path), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("best: ") and "ranking plans" not in err
