"""The budget and ordering logic of the tuning plan (pure: no TVM, no boards)."""

import json
from pathlib import Path

from edgetune.tune.plan import model_budgets, order_tasks, plan_class, spread_rounds
from edgetune.tune.tasks import KernelTask

from fleets import AVX512, make_fleet, mlp


def task(name: str, flops: float, weight: float = 1.0, model: str = "mlp") -> KernelTask:
    return KernelTask(name, f"h-{name}", flops, weight, ((model, int(weight)),))


def fleet(tmp_path: Path, trials: int, per_iter: int = 8, per_task: int | None = 32, models=(mlp(),)):
    return make_fleet(tmp_path, 9999, {"a": AVX512}, {"a": 2}, models, trials, per_iter, per_task)


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


def test_plan_warns_when_budget_cannot_cover_every_task(tmp_path):
    tasks = tuple(task(f"t{i}", 1e6 * (i + 1)) for i in range(5))
    plan = plan_class(fleet(tmp_path, 24), "a", (mlp(),), tasks, {})
    assert [t.planned for t in plan.tasks] == [8, 8, 8, 0, 0]
    assert len(plan.uncovered) == 2
    assert "cannot cover every task: 2 of 5" in plan.warnings[0]
    assert "at least 40 trials" in plan.warnings[0]


def test_finished_plan_spends_nothing_and_is_json(tmp_path):
    tasks = (task("a", 1e6), task("b", 2e6))
    plan = plan_class(fleet(tmp_path, 16), "a", (mlp(),), tasks, {"h-a": 8, "h-b": 8})
    assert plan.remaining == 0 and plan.done == 16 and not plan.warnings
    assert json.loads(json.dumps(plan.__dict__, default=str))["budget"] == 16
