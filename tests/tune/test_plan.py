"""The budget and ordering logic of the tuning plan (pure: no TVM, no boards)."""

import json
from dataclasses import replace
from pathlib import Path

from support.fleets import V3, make_fleet, mlp, task, tasks_named

from edgetune.tune.budget import Throughput
from edgetune.tune.database import TrialRecord
from edgetune.tune.plan import model_budgets, order_tasks, plan_class, spread_rounds


def recorded(done: dict[str, int]) -> list[TrialRecord]:
    return [TrialRecord(h, 1e-3) for h, n in done.items() for _ in range(n)]


def fleet(tmp_path: Path, trials: int, per_iter: int = 8, per_task: int | None = 32, models=None):
    return make_fleet(tmp_path, 9999, {"a": V3}, {"a": 2}, models or (mlp(),), trials, per_iter, per_task)


def test_budget_is_split_by_model_weight(tmp_path):
    f = fleet(tmp_path, 128, models=(mlp("small", 1), mlp("big", 3)))
    assert model_budgets(f.tuning, "a", f.models) == {"small": 32, "big": 96}


def test_every_task_gets_a_round_before_any_second():
    assert spread_rounds([0, 0, 0], 40, 16, 64) == [16, 16, 8]
    assert spread_rounds([0, 0, 0], 100, 16, 64) == [36, 32, 32]
    assert spread_rounds([0, 0], 100, 16, 20) == [20, 20]  # capped per task, budget left over


def test_resumed_trials_count_against_the_cap():
    assert spread_rounds([16, 0], 32, 16, 24) == [8, 24]


def test_largest_weighted_cost_first_and_unmeasured_before_measured():
    tasks = (task("small", 1e6), task("big", 1e7), task("heavy", 1e6, weight=20))
    assert [t.name for t in order_tasks(tasks, {})] == ["heavy", "big", "small"]
    assert [t.name for t in order_tasks(tasks, {"h-heavy": 8})] == ["big", "small", "heavy"]


def test_a_class_budget_too_small_for_a_round_each_is_raised_to_one(tmp_path):
    plan = plan_class(fleet(tmp_path, 192, per_iter=16, per_task=None), "a", (mlp(),), tasks_named(60), [])
    assert plan.budget == plan.remaining == 960 and not plan.uncovered and not plan.warnings
    assert {t.planned for t in plan.tasks} == {16}
    assert "192 trials per class, raised to 960 so that each of 60 tasks gets a round of 16" in plan.format()


def test_trials_per_task_gives_every_task_its_share_resumed_trials_counted(tmp_path):
    policy = replace(fleet(tmp_path, 0).tuning, trials_per_class=None, trials_per_task=32, max_trials_per_task=None)
    per_task = fleet(tmp_path, 0).replace(tuning=policy)
    plan = plan_class(per_task, "a", (mlp(),), tasks_named(60), recorded({"h-t05": 16, "h-t07": 40}))
    assert plan.budget == 60 * 32 and plan.done == 56
    planned = {t.name: t.planned for t in plan.tasks}
    assert planned["t05"] == 16 and planned["t07"] == 0 and planned["t00"] == 32
    assert plan.remaining == 58 * 32 + 16
    assert "32 trials per task x 60 tasks" in plan.format()


def test_without_any_budget_a_task_gets_one_round(tmp_path):
    policy = replace(fleet(tmp_path, 0).tuning, trials_per_class=None, max_trials_per_task=None)
    plan = plan_class(fleet(tmp_path, 0).replace(tuning=policy), "a", (mlp(),), tasks_named(3), [])
    assert [t.planned for t in plan.tasks] == [8] * 3
    sixty = plan_class(
        fleet(tmp_path, 0, per_iter=16).replace(tuning=replace(policy, trials_per_iter=16)),
        "a",
        (mlp(),),
        tasks_named(60),
        [],
        Throughput(200, 400.0, 2, 2),
    )
    assert sixty.remaining == 960 and "time: about 32 min" in sixty.format()  # a 60-task model at 2 s per trial


def test_no_trials_for_a_class_leaves_its_tasks_untuned_and_says_so(tmp_path):
    plan = plan_class(fleet(tmp_path, 0), "a", (mlp(),), tasks_named(5), [])
    assert plan.remaining == 0 and len(plan.uncovered) == 5
    assert "5 of 5 tasks get no trial" in plan.warnings[0]


def test_a_task_whose_trials_show_its_knee_gets_none_and_frees_its_share(tmp_path):
    flat = [TrialRecord("h-t00", 1e-3 * (1 + 0.001 * (i % 3))) for i in range(40)]
    gaining = [TrialRecord("h-t01", 1e-3 / (1 + i)) for i in range(40)]
    policy = replace(fleet(tmp_path, 0).tuning, trials_per_class=None, trials_per_task=64, max_trials_per_task=None)
    plan = plan_class(fleet(tmp_path, 0).replace(tuning=policy), "a", (mlp(),), tasks_named(2), flat + gaining)
    by_name = {t.name: t for t in plan.tasks}
    assert by_name["t00"].at_knee and by_name["t00"].planned == 0
    assert not by_name["t01"].at_knee and by_name["t01"].planned == 24
    assert plan.freed == 24 and plan.remaining == 48
    assert "24 trials of tasks at their knee go to the tasks that still gain" in plan.format()


def test_the_plan_says_how_long_at_the_rate_earlier_runs_measured(tmp_path):
    tasks = tasks_named(4)
    unmeasured = plan_class(fleet(tmp_path, 64), "a", (mlp(),), tasks, [])
    assert "unknown: no run of this class has been measured yet" in unmeasured.format()
    measured = plan_class(fleet(tmp_path, 64), "a", (mlp(),), tasks, [], Throughput(200, 300.0, 2, 2))
    assert "time: about 96 s (1.50 s per trial measured over 200 trials in 2 runs, 2 boards)" in measured.format()


def test_finished_plan_spends_nothing_and_is_json(tmp_path):
    tasks = (task("a", 1e6), task("b", 2e6))
    plan = plan_class(fleet(tmp_path, 16), "a", (mlp(),), tasks, recorded({"h-a": 8, "h-b": 8}))
    assert plan.remaining == 0 and plan.done == 16 and not plan.warnings
    assert json.loads(json.dumps(plan.__dict__, default=str))["budget"] == 16


def test_dry_run_plan_imports_the_models_and_times_the_run_from_the_class_log(tmp_path):
    """What `edgetune tune --dry-run` prints: the real tasks of the mlp, the time at the rate in runs.jsonl."""
    from edgetune.tune.database import ClassDatabasePaths, append_run
    from edgetune.tune.plan import plan_tuning

    policy = replace(fleet(tmp_path, 0).tuning, trials_per_class=None, trials_per_task=16, max_trials_per_task=None)
    per_task = fleet(tmp_path, 0).replace(tuning=policy)
    paths = ClassDatabasePaths.of(tmp_path, "a")
    paths.directory.mkdir(parents=True)
    append_run(paths, 40, 30.0, 2)
    append_run(paths, 24, 18.0, 2)
    plan = plan_tuning(per_task).classes[0]
    assert len(plan.tasks) == 2 and plan.remaining == 32
    assert "time: about 24 s (0.75 s per trial measured over 64 trials in 2 runs, 2 boards)" in plan.format()
