"""The nightly launchers in ``launchers/``: each schedule is valid for its scheduler, and each command line is
one that ``autotune retune`` accepts (parsed by autotune's own argument parser).

The CronJob is validated offline by kubernetes-validate in strict mode (unknown fields and wrong types fail);
the systemd units by ``systemd-analyze verify`` where it exists, else by reading them as INI files."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autotune.cli import build_parser

LAUNCHERS = Path(__file__).resolve().parents[2] / "launchers"
_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\d+(-\d+)?)(/\d+)?)*$")
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _retune_args(words: list[str]):
    """The ``autotune retune ...`` inside a shell command, parsed as the CLI parses it."""
    start = next(
        i for i, w in enumerate(words) if w.endswith("autotune") and words[i + 1 : i + 2] == ["retune"]
    )
    argv = []
    for word in words[start + 1 :]:
        if re.fullmatch(r"[;&|<>()]+|\d?>+&?\d*", word):  # the end of the command: a shell operator
            break
        argv.append(word)
    args = build_parser().parse_args(argv)  # exits 2 on an unknown flag or a bad value
    assert args.command == "retune"
    return args


def _check_schedule(schedule: str) -> None:
    fields = schedule.split()
    assert len(fields) == 5, f"a cron schedule has 5 fields: {schedule!r}"
    for field, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        assert _CRON_FIELD.match(field), f"bad cron field {field!r} in {schedule!r}"
        for number in map(int, re.findall(r"\d+", field.split("/")[0])):
            assert low <= number <= high, f"{number} outside {low}-{high} in {schedule!r}"


def _cron_line(line: str):
    fields = line.split(None, 5)
    _check_schedule(" ".join(fields[:5]))
    lexer = shlex.shlex(fields[5], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return _retune_args(list(lexer))


def _entries(path: Path) -> list[str]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return [ln for ln in lines if not re.match(r"^[A-Z_]+=", ln)]  # crontab variable lines


def test_cron_line_schedules_a_valid_retune():
    (entry,) = _entries(LAUNCHERS / "retune.cron")
    args = _cron_line(entry)
    assert args.study and args.storage == "$AUTOTUNE_STORAGE" and args.budget == "30m"


def test_scrontab_has_slurm_options_and_a_valid_retune():
    text = (LAUNCHERS / "retune.scrontab").read_text()
    options = [ln.split(None, 1)[1] for ln in text.splitlines() if ln.startswith("#SCRON")]
    assert {o.split("=")[0] for o in options} >= {"--job-name", "--time", "--gpus-per-node"}
    assert all(re.fullmatch(r"--[a-z-]+(=\S+)?", o) for o in options), options
    (entry,) = _entries(LAUNCHERS / "retune.scrontab")
    assert _cron_line(entry).study


def test_kubernetes_cronjob_is_valid_batch_v1_in_strict_mode():
    kv = pytest.importorskip("kubernetes_validate")
    job = yaml.safe_load((LAUNCHERS / "retune-cronjob.yaml").read_text())
    kv.validate(job, kv.latest_version(), strict=True)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "CronJob")
    assert job["spec"]["concurrencyPolicy"] == "Forbid"
    assert job["spec"]["jobTemplate"]["spec"]["backoffLimit"] == 0  # exit 3 fails the Job, no retry
    _check_schedule(job["spec"]["schedule"])
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert _retune_args(container["command"] + container["args"]).storage == "$(AUTOTUNE_STORAGE)"


def test_kubernetes_validate_catches_a_misspelt_field():
    kv = pytest.importorskip("kubernetes_validate")
    job = yaml.safe_load((LAUNCHERS / "retune-cronjob.yaml").read_text())
    job["spec"]["concurrencypolicy"] = job["spec"].pop("concurrencyPolicy")
    with pytest.raises(kv.ValidationError):
        kv.validate(job, kv.latest_version(), strict=True)


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_systemd_service_and_timer():
    service, timer = _unit(LAUNCHERS / "autotune-retune.service"), _unit(LAUNCHERS / "autotune-retune.timer")
    assert service["Service"]["Type"] == "oneshot"
    assert _retune_args(shlex.split(service["Service"]["ExecStart"])).storage == "${AUTOTUNE_STORAGE}"
    assert timer["Timer"]["Unit"] == "autotune-retune.service"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert timer["Timer"]["OnCalendar"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_units(tmp_path):
    for name in ("autotune-retune.service", "autotune-retune.timer"):
        shutil.copy(LAUNCHERS / name, tmp_path / name)
    done = subprocess.run(
        ["systemd-analyze", "verify", "autotune-retune.service", "autotune-retune.timer"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    schedule = _unit(LAUNCHERS / "autotune-retune.timer")["Timer"]["OnCalendar"]
    calendar = subprocess.run(
        ["systemd-analyze", "calendar", schedule], capture_output=True, text=True, timeout=60
    )
    assert calendar.returncode == 0 and "02:30:00" in calendar.stdout
