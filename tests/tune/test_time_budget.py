"""A time limit as the budget: the plan and the scheduler's rule on given numbers (a round per
task, then rounds by expected gain, no round that would end past the limit), the default
budget of a 60-task model, and the time limit `edgetune import` suggests for a real ONNX model
(its tasks extracted with TVM). The run on a loopback board is test_budget.py's third run."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from support.fleets import V3, make_fleet, mlp, tasks_named
from support.onnx_samples import conv_model
from support.tests_samples import FAKE_PRIVATE_KEY

from edgetune.cli import main
from edgetune.compiler.target import build_target
from edgetune.compiler.tasks import class_tasks
from edgetune.tune.budget import (
    DEFAULT_SECONDS_PER_TRIAL,
    MIN_TIME_ROUND,
    TaskLedger,
    Throughput,
    choose_task,
    round_fits,
    suggest_time_limit,
    time_is_the_budget,
)
from edgetune.tune.database import ClassDatabasePaths, TrialRecord, append_run
from edgetune.tune.monitor import RunState
from edgetune.tune.plan import plan_class
from edgetune.tune.report import progress_line

PROFILES = Path(__file__).resolve().parents[2] / "device_profiles"


def timed_fleet(tmp_path, limit_s: float | None, per_class: int | None = None, cap: int | None = None):
    fleet = make_fleet(tmp_path, 9999, {"a": V3}, {"a": 2}, (mlp(),), 0, 16, cap)
    return fleet.replace(tuning=replace(fleet.tuning, trials_per_class=per_class, time_limit_s=limit_s))


def test_a_time_limit_without_a_trial_budget_is_the_budget(tmp_path):
    assert time_is_the_budget(timed_fleet(tmp_path, 600).tuning, "a")
    assert not time_is_the_budget(timed_fleet(tmp_path, 600, per_class=64).tuning, "a")  # both: trials and time
    assert not time_is_the_budget(timed_fleet(tmp_path, None).tuning, "a")


def test_the_plan_gives_a_round_each_then_deals_what_fits_by_expected_gain(tmp_path):
    plan = plan_class(timed_fleet(tmp_path, 600), "a", (mlp(),), tasks_named(10), [], Throughput(300, 300.0, 1, 2))
    assert plan.time_is_the_budget and [t.planned for t in plan.tasks] == [16] * 10
    assert plan.by_gain == 600 - 160 and plan.remaining == plan.budget == 600
    text = plan.format()
    assert "440 trials after a round each go to the tasks expected to gain most" in text
    assert "time: up to the time limit of 600 s (10 min): 600 trials at the measured rate" in text
    assert (
        "time limit of 600 s (10 min): a round of 16 per task, then rounds to the tasks expected to gain most" in text
    )


def test_a_limit_too_short_for_a_round_of_16_each_deals_smaller_rounds_so_every_task_gets_one(tmp_path):
    plan = plan_class(timed_fleet(tmp_path, 100), "a", (mlp(),), tasks_named(10), [], Throughput(100, 100.0, 1, 2))
    assert plan.trials_per_iter == 10 and [t.planned for t in plan.tasks] == [10] * 10
    assert not plan.uncovered and not plan.warnings
    assert (
        "a round of 10 per task (not 16: the limit holds no more for each of 10 tasks at the measured rate)"
        in plan.format()
    )


def test_before_any_rate_is_measured_the_round_fits_the_limit_at_the_stated_rate(tmp_path):
    plan = plan_class(timed_fleet(tmp_path, 160), "a", (mlp(),), tasks_named(10), [])  # 80 trials at 2 s each
    assert plan.trials_per_iter == 8 and [t.planned for t in plan.tasks] == [8] * 10
    assert f"at a stated {DEFAULT_SECONDS_PER_TRIAL:g} s per trial" in plan.format()


def test_a_limit_too_short_even_for_the_smallest_round_says_which_limit_would_do(tmp_path):
    plan = plan_class(timed_fleet(tmp_path, 20), "a", (mlp(),), tasks_named(10), [], Throughput(100, 100.0, 1, 2))
    assert plan.trials_per_iter == MIN_TIME_ROUND
    assert [t.planned for t in plan.tasks] == [4] * 5 + [0] * 5 and len(plan.uncovered) == 5
    assert "5 of 10 tasks get no trial within the time limit" in plan.warnings[0]
    assert "set tuning.time_limit_s to 60 for a round of 4 each" in plan.warnings[0]  # 40 s and a tenth, whole minutes


def test_before_any_rate_is_measured_the_plan_counts_a_round_each_capped(tmp_path):
    plan = plan_class(timed_fleet(tmp_path, 600, cap=8), "a", (mlp(),), tasks_named(4), [])
    assert [t.planned for t in plan.tasks] == [8] * 4 and plan.by_gain == 0
    assert "the first run measures the trial rate" in plan.format()


def test_a_trial_budget_under_a_time_limit_says_where_the_limit_ends_it(tmp_path):
    plan = plan_class(
        timed_fleet(tmp_path, 60, per_class=320), "a", (mlp(),), tasks_named(4), [], Throughput(100, 100.0, 1, 2)
    )
    assert not plan.time_is_the_budget and plan.remaining == 320
    assert "the time limit of 60 s ends it after about 60 trials" in plan.format()


def test_after_a_round_each_the_next_round_goes_where_it_is_expected_to_gain_most():
    def ledger(name, weight, history, rounds=1):
        return TaskLedger(name, weight, share=4, ceiling=1000, history=list(history), spent=4, rounds=rounds)

    fresh = TaskLedger("fresh", 1.0, share=4, ceiling=1000, history=[])
    big_gain = ledger("big", 1.0, [3.0] * 4 + [1.0] * 4, rounds=2)  # its last round took 2 s off
    weighted = ledger("weighted", 10.0, [1.0] * 4 + [0.9] * 4, rounds=2)  # 0.1 s off, 10 calls: 1 s
    ledgers = [big_gain, weighted, fresh]
    assert choose_task(ledgers, [True] * 3, {}, 1000, 4, 4) == 2  # a round each before any further one
    fresh.spent, fresh.rounds, fresh.history = 4, 1, [5.0] * 4
    assert choose_task(ledgers, [True] * 3, {}, 1000, 4, 4) == 2  # too new to tell: served first
    fresh.spent, fresh.rounds, fresh.history = 8, 2, [5.0] * 8  # gained nothing
    assert choose_task(ledgers, [True] * 3, {}, 1000, 4, 4) == 0  # 2 s x 1 beats 0.1 s x 10
    big_gain.spent, big_gain.history = 12, big_gain.history + [1.0] * 4
    assert choose_task(ledgers, [True] * 3, {}, 1000, 4, 4) == 1


def test_a_task_the_plan_dealt_no_round_gets_one_before_any_task_a_second():
    # the rate of earlier runs fitted rounds for only some tasks; the run went faster than that
    gaining = TaskLedger("gaining", 1.0, share=4, ceiling=1000, history=[3.0] * 4 + [1.0] * 4, spent=4, rounds=1)
    not_dealt = TaskLedger("not dealt", 1.0, share=0, ceiling=1000, history=[1.0] * 8)  # flat in earlier runs
    assert choose_task([gaining, not_dealt], [True, True], {}, 1000, 4, 4) == 1
    assert not_dealt.share == 4  # a round of its own


def test_tasks_too_new_to_tell_go_by_their_weighted_latency():
    light = TaskLedger("light", 1.0, share=4, ceiling=100, history=[1.0] * 4, spent=4, rounds=1)
    heavy = TaskLedger("heavy", 3.0, share=4, ceiling=100, history=[1.0] * 4, spent=4, rounds=1)
    assert choose_task([light, heavy], [True, True], {}, 100, 4, 4) == 1


def test_a_round_starts_only_if_it_ends_within_the_limit():
    assert round_fits(0.0, None, None, 0)
    assert round_fits(9.0, 10.0, None, 0) and not round_fits(10.5, 10.0, None, 0)  # no round measured yet
    assert round_fits(6.0, 10.0, 2.0, 1)  # ends at 10 s, after the one measuring
    assert not round_fits(6.5, 10.0, 2.0, 1)


def test_the_pace_counts_the_round_still_measuring():
    """One round measured and one measuring 4.2 s in: 2.1 s a round, the next ends at 8.4 s."""
    ledger = TaskLedger("relu", 1.0, share=8, ceiling=8, history=[], spent=0, rounds=0)
    state = RunState(
        device_class="host",
        task_calls={},
        ledgers=[ledger],
        names=["relu"],
        run_budget=8,
        trials_per_iter=4,
        early_stop=None,
        time_limit_s=10.0,
        rounds_measured=1,
        first_round_started=time.monotonic() - 4.2,
    )
    assert not state.out_of_time(in_flight=1, measuring=1)
    state.first_round_started = time.monotonic() - 6.3  # two measured, one measuring: ends at 10.5 s
    state.rounds_measured = 2
    assert state.out_of_time(in_flight=1, measuring=1)
    assert not state.out_of_time(in_flight=0, measuring=0)  # nothing in flight: ends at 9.45 s


def test_the_suggested_limit_is_a_round_each_at_the_measured_or_default_rate():
    default = suggest_time_limit(60, 16, None)
    assert default.seconds_per_trial == DEFAULT_SECONDS_PER_TRIAL
    assert (
        default.round_each_s == 60 * 16 * DEFAULT_SECONDS_PER_TRIAL and default.time_limit_s == 2160
    )  # 1920 s and a tenth: 36 min
    measured = suggest_time_limit(60, 16, Throughput(400, 200.0, 2, 2))
    assert measured.time_limit_s == 540 and "0.50 s per trial measured over 400 trials" in measured.explain()
    assert suggest_time_limit(1, 16, Throughput(10, 1.0, 1, 1)).time_limit_s == 60  # at least a minute


@pytest.fixture(scope="module")
def conv_tasks(tmp_path_factory):
    model = conv_model(tmp_path_factory.mktemp("conv") / "conv.onnx", batch=1)  # static sizes: import runs it
    return model.onnx, len(
        class_tasks(
            (model,),
            build_target(
                make_fleet(model.onnx.parent, 9999, {"a": V3}, {"a": 1}, (model,), 0).device_class("a").profile
            ),
        ).tasks
    )


def test_import_prints_the_time_limit_line_to_add(conv_tasks, tmp_path, monkeypatch, capsys):
    path, tasks = conv_tasks
    monkeypatch.chdir(tmp_path)  # no fleet.yaml here: the stated default rate
    assert main(["import", str(path), "--name", "conv"]) == 0
    out = capsys.readouterr().out
    expected = suggest_time_limit(tasks, 16, None)
    assert f"# tuning time budget: {tasks} tasks x a round of 16 trials at 2.00 s per trial (a stated default" in out
    assert out.endswith(f"# tuning:\n#   time_limit_s: {expected.time_limit_s}\n")


def write_two_class_fleet(directory: Path) -> None:
    """A fleet.yaml of two classes (import reads only their targets and the workdir)."""
    key = directory / "id_ed25519"
    key.write_text(FAKE_PRIVATE_KEY)
    key.chmod(0o600)
    (directory / "fleet.yaml").write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "import-test",
                "workdir": "work",
                "trackers": [{"name": "host", "bind_host": "127.0.0.1", "public_address": "127.0.0.1", "port": 9190}],
                "ssh": {"user": "root", "key": str(key), "known_hosts": "known_hosts"},
                "device_classes": [
                    {"name": "fast", "profile": str(PROFILES / "x86-avx512.yaml")},
                    {"name": "slow", "profile": str(PROFILES / "rpi4.yaml")},
                ],
                "boards": [
                    {
                        "name": f"{c}-1",
                        "address": f"{c}-1.local",
                        "device_class": c,
                        "tracker": "host",
                        "python": "/usr/bin/python3",
                        "workdir": "/var/lib/edgetune",
                    }
                    for c in ("fast", "slow")
                ],
                "models": [{"name": "mlp", "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256]}]}],
                "tuning": {"trials_per_iter": 8},
                "artifacts": {"dir": "artifacts", "signing_key": "keys/signing.key", "public_key": "keys/signing.pub"},
            }
        )
    )


def test_import_uses_the_rate_measured_in_the_fleets_workdir(conv_tasks, tmp_path, monkeypatch, capsys):
    path, tasks = conv_tasks
    monkeypatch.chdir(tmp_path)
    write_two_class_fleet(tmp_path)
    for name, seconds in (("fast", 400.0), ("slow", 1200.0)):  # the slowest class must fit
        paths = ClassDatabasePaths.of(tmp_path / "work", name)
        paths.directory.mkdir(parents=True)
        append_run(paths, 400, seconds, 1)
    assert main(["import", str(path), "-f", "fleet.yaml"]) == 0
    out = capsys.readouterr().out
    expected = suggest_time_limit(tasks, 8, Throughput(400, 1200.0, 1, 1))
    assert f"{tasks} tasks x a round of 8 trials at 3.00 s per trial measured over 400 trials in this workdir" in out
    assert f"#   time_limit_s: {expected.time_limit_s}\n" in out
    assert yaml.safe_load(out)["models"][0]["name"] == "conv"  # the comments keep the entry valid YAML


def test_progress_of_a_timed_run_shows_the_time_used_not_a_trial_bound():
    timed = progress_line("a", 48, None, 5, 9, {"mlp": None}, 0, 1, (95.4, 1800.0))
    assert timed == "[a] trials 48 this run (95/1800 s)  tasks 5/9  best est. mlp -  boards busy 0/1"
    counted = progress_line("a", 48, 128, 5, 9, {"mlp": 52e-6}, 1, 2)
    assert counted == "[a] trials 48/128 this run  tasks 5/9  best est. mlp 0.052 ms  boards busy 1/2"


def test_seeded_tasks_wait_for_every_first_round_then_get_whole_rounds(tmp_path):
    """Seeding (borrowing, starter records) measured half a round of t00 and t01 before the run:
    with a time budget, t02 and t03 get their first rounds first, and the seeded tasks then get
    whole rounds by expected gain, not the half rounds their plan had left."""
    from edgetune.compiler.tasks import ClassTasks
    from edgetune.tune.tuner import _run_state

    tasks = tasks_named(4)
    fleet = timed_fleet(tmp_path, 600)
    plan = plan_class(fleet, "a", (mlp(),), tasks, [], Throughput(300, 300.0, 1, 2))
    seeded = {"h-t00": 8, "h-t01": 8}
    earlier = [TrialRecord("h-t00", 5e-4)] + [TrialRecord(h, 1e-3 * (i + 1)) for h in seeded for i in range(8)]
    state = _run_state(fleet, plan, ClassTasks({}, tasks, {}), list(plan.tasks), seeded, earlier)
    assert state.best == {"h-t00": 1e-3, "h-t01": 1e-3}  # the seeds' best, not an earlier run's 0.5 ms
    ledgers = state.ledgers
    order, sizes = [], []
    while not {"h-t00", "h-t01"} <= set(order) and len(order) < 10:
        chosen = choose_task(ledgers, [True] * 4, {}, state.run_budget, plan.trials_per_iter, 4)
        order.append(ledgers[chosen].workload_hash)
        size = min(plan.trials_per_iter, ledgers[chosen].share - ledgers[chosen].spent)
        sizes.append(size)
        ledgers[chosen].rounds += 1
        ledgers[chosen].record([1.0] * size)
    assert order[:2] == ["h-t02", "h-t03"] and {"h-t00", "h-t01"} <= set(order)
    assert sizes == [plan.trials_per_iter] * len(order)
