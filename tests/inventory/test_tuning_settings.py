"""The tuning budget settings: which rule a fleet gets, and bad settings refused by `edgetune
check` with exit code 2, naming the file and the field; `edgetune plan` says the time."""

from __future__ import annotations

import json

import pytest
from support.inventory_files import base_fleet, write

from edgetune.cli import main
from edgetune.inventory import load_fleet
from edgetune.inventory.schema import DEFAULT_ROUNDS_PER_TASK, EarlyStop


def fleet_with(tmp_path, **tuning):
    data = base_fleet(tmp_path)
    data["tuning"] = {key: value for key, value in {**data["tuning"], **tuning}.items() if value is not None}
    return write(tmp_path, data)


def test_trials_per_task_makes_the_budget_per_task_except_for_a_class_override(tmp_path):
    policy = load_fleet(
        fleet_with(tmp_path, trials_per_class=None, trials_per_task=48, trials_per_class_override={"rpi4": 300})
    ).tuning
    assert policy.task_budget_rule("avx512") == ("per_task", 48)
    assert policy.task_budget_rule("rpi4") == ("per_class", 300)


def test_without_either_setting_a_task_gets_the_default_rounds_and_early_stop_is_on(tmp_path):
    policy = load_fleet(fleet_with(tmp_path, trials_per_class=None, trials_per_iter=8)).tuning
    assert policy.task_budget_rule("avx512") == ("per_task", DEFAULT_ROUNDS_PER_TASK * 8)
    assert policy.early_stop == EarlyStop(window=32, min_gain=0.02)


def test_early_stop_can_be_set_or_turned_off(tmp_path):
    assert load_fleet(fleet_with(tmp_path, early_stop={"window": 16, "min_gain": 0.05})).tuning.early_stop == EarlyStop(
        16, 0.05
    )
    assert load_fleet(fleet_with(tmp_path, early_stop=False)).tuning.early_stop is None


@pytest.mark.parametrize(
    "tuning, expected",
    [
        (
            {"trials_per_task": 64},
            "fleet.yaml: tuning.trials_per_task: give either trials_per_task (trials each task gets) or trials_per_class",
        ),
        (
            {"trials_per_class": None, "trials_per_task": 40},
            "fleet.yaml: tuning.trials_per_task: must be a whole number of rounds of tuning.trials_per_iter (16): MetaSchedule measures a task a round at a time; use 32 or 48, got 40",
        ),
        (
            {"trials_per_class": None, "trials_per_task": 0},
            "fleet.yaml: tuning.trials_per_task: must be positive, got 0",
        ),
        (
            {"trials_per_class": None, "trials_per_task": 64, "max_trials_per_task": 32},
            "fleet.yaml: tuning.max_trials_per_task: must be at least tuning.trials_per_task (64)",
        ),
        ({"early_stop": {"window": 0}}, "fleet.yaml: tuning.early_stop.window: must be positive, got 0"),
        (
            {"early_stop": {"min_gain": 1.5}},
            "fleet.yaml: tuning.early_stop.min_gain: must be between 0 and 0.99, got 1.5",
        ),
        ({"early_stop": {"patience": 3}}, "fleet.yaml: tuning.early_stop.patience: unknown key"),
        ({"early_stop": "soon"}, "fleet.yaml: tuning.early_stop: must be a mapping with keys window, min_gain"),
        ({"time_limit_s": -1}, "fleet.yaml: tuning.time_limit_s: must be positive, got -1"),
    ],
    ids=[
        "both-budgets",
        "not-whole-rounds",
        "zero",
        "cap-below-share",
        "window",
        "gain",
        "unknown-key",
        "not-mapping",
        "time-limit",
    ],
)
def test_bad_budget_settings_exit_2_naming_file_and_field(tmp_path, capsys, tuning, expected):
    assert main(["check", "-f", str(fleet_with(tmp_path, **tuning))]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_plan_says_how_long_the_budget_takes_at_the_measured_rate(tmp_path, capsys):
    path = fleet_with(tmp_path, trials_per_class=None, trials_per_task=32)
    assert main(["plan", "-f", str(path)]) == 0
    assert "avx512: tuning time unknown: no run of this class has been measured yet" in capsys.readouterr().out
    runs = load_fleet(path).workdir / "databases" / "avx512" / "runs.jsonl"
    runs.parent.mkdir(parents=True)
    runs.write_text(json.dumps({"trials": 100, "seconds": 50.0, "boards": 2}) + "\n")
    assert main(["plan", "-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert "32 per task" in out
    assert (
        "avx512: tuning time about 16 s (0.50 s per trial measured over 100 trials in 1 run, 2 boards) per task" in out
    )
