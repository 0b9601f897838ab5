"""The tuning plan: which boards, models, tasks and trial budgets each device class gets.

Pure data computed before anything is measured (`edgetune tune --dry-run` prints it).
Budgets: a class's `trials_per_class` is split over the fleet's models by weight; the selected
models' shares make the class budget. Trials already in the class database count against it
(resume). The remaining trials go round by round (`trials_per_iter` each), never-measured
tasks first and then by weighted cost, largest first, so every task gets one round before any
gets a second. MetaSchedule's gradient task scheduler spends them in that order; the per-task
`planned` figures are the plan's forecast of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

from tabulate import tabulate

from edgetune.inventory.fleet_plan import split_budget
from edgetune.inventory.schema import Fleet, Model, TuningPolicy
from edgetune.tune.database import recorded_trials
from edgetune.tune.tasks import KernelTask, class_task_list


@dataclass(frozen=True)
class TaskPlan:
    name: str
    workload_hash: str
    flops: float
    weight: float
    models: tuple[str, ...]
    done: int  # trials already in the class database
    planned: int  # trials this run is expected to spend on it


@dataclass(frozen=True)
class ClassPlan:
    device_class: str
    profile: str
    target: Mapping[str, object]
    boards: tuple[str, ...]
    models: tuple[str, ...]
    model_budgets: tuple[tuple[str, int], ...]
    budget: int  # trials for the selected models, done ones included
    done: int
    remaining: int
    trials_per_iter: int
    max_trials_per_task: int
    borrow_from: str | None
    tasks: tuple[TaskPlan, ...]  # in tuning order
    warnings: tuple[str, ...]

    @property
    def uncovered(self) -> tuple[TaskPlan, ...]:
        return tuple(t for t in self.tasks if t.done + t.planned == 0)


@dataclass(frozen=True)
class TuningPlan:
    classes: tuple[ClassPlan, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(w for c in self.classes for w in c.warnings)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def format(self) -> str:
        return "\n\n".join(_format_class(c) for c in self.classes)


def model_budgets(policy: TuningPolicy, device_class: str, models: tuple[Model, ...]) -> dict[str, int]:
    """The class's trials split over all the fleet's models by weight."""
    return split_budget(policy.trials_for(device_class), {m.name: m.weight for m in models})


def order_tasks(tasks: tuple[KernelTask, ...], done: Mapping[str, int]) -> tuple[KernelTask, ...]:
    """Never-measured tasks first, then largest weighted cost first (stable by name)."""
    return tuple(
        sorted(tasks, key=lambda t: (done.get(t.workload_hash, 0) > 0, -t.cost, t.name))
    )


def spread_rounds(done: list[int], remaining: int, per_iter: int, cap: int) -> list[int]:
    """Trials per task (in the given order): one round each before any second, up to `cap`
    trials per task in total, until `remaining` is spent."""
    planned = [0] * len(done)
    while remaining > 0:
        progressed = False
        for i, already in enumerate(done):
            room = cap - already - planned[i]
            if room <= 0 or remaining <= 0:
                continue
            take = min(per_iter, room, remaining)
            planned[i] += take
            remaining -= take
            progressed = True
        if not progressed:
            break
    return planned


def plan_class(
    fleet: Fleet,
    device_class: str,
    models: tuple[Model, ...],
    tasks: tuple[KernelTask, ...],
    done: Mapping[str, int],
) -> ClassPlan:
    """The plan of one class from its deduplicated tasks and the trials already recorded."""
    policy = fleet.tuning
    profile = fleet.device_class(device_class).profile
    cap = policy.max_trials_per_task or policy.trials_for(device_class)
    shares = model_budgets(policy, device_class, fleet.models)
    budget = sum(shares[m.name] for m in models)
    ordered = order_tasks(tasks, done)
    already = [done.get(t.workload_hash, 0) for t in ordered]  # every trial spent counts, even past the cap
    remaining = max(budget - sum(already), 0)
    planned = spread_rounds(already, remaining, policy.trials_per_iter, cap)
    task_plans = tuple(
        TaskPlan(t.name, t.workload_hash, t.flops, t.weight, tuple(m for m, _ in t.uses), d, p)
        for t, d, p in zip(ordered, already, planned)
    )
    plan = ClassPlan(
        device_class=device_class,
        profile=str(profile.path),
        target=profile.target_json(),
        boards=tuple(b.name for b in fleet.boards_of(device_class)),
        models=tuple(m.name for m in models),
        model_budgets=tuple((m.name, shares[m.name]) for m in models),
        budget=budget,
        done=sum(already),
        remaining=sum(planned),
        trials_per_iter=policy.trials_per_iter,
        max_trials_per_task=cap,
        borrow_from=policy.borrow.get(device_class),
        tasks=task_plans,
        warnings=(),
    )
    return _with_warnings(plan)


def plan_tuning(
    fleet: Fleet,
    classes: tuple[str, ...] | None = None,
    models: tuple[str, ...] | None = None,
    tasks_of: Callable[[Fleet, str, tuple[Model, ...]], tuple[KernelTask, ...]] | None = None,
    done_of: Callable[[Fleet, str], Mapping[str, int]] | None = None,
) -> TuningPlan:
    """The plan for the selected classes and models (default: all). `tasks_of` and `done_of`
    default to extracting the tasks with TVM and counting the class database's records;
    nothing is measured and no machine is touched."""
    selected_models = select_models(fleet, models)
    return TuningPlan(
        tuple(
            plan_class(
                fleet,
                name,
                selected_models,
                (tasks_of or class_task_list)(fleet, name, selected_models),
                (done_of or recorded_trials)(fleet, name),
            )
            for name in select_classes(fleet, classes)
        )
    )


def select_classes(fleet: Fleet, names: tuple[str, ...] | None) -> tuple[str, ...]:
    from edgetune.errors import TuneError

    known = tuple(c.name for c in fleet.device_classes)
    for name in names or ():
        if name not in known:
            raise TuneError(f"--class {name!r}: no such device class in {fleet.path} (known: {', '.join(known)})")
    return tuple(n for n in known if not names or n in names)


def select_models(fleet: Fleet, names: tuple[str, ...] | None) -> tuple[Model, ...]:
    from edgetune.errors import TuneError

    known = tuple(m.name for m in fleet.models)
    for name in names or ():
        if name not in known:
            raise TuneError(f"--model {name!r}: no such model in {fleet.path} (known: {', '.join(known)})")
    return tuple(m for m in fleet.models if not names or m.name in names)


def _with_warnings(plan: ClassPlan) -> ClassPlan:
    warnings = []
    if plan.uncovered:
        needed = plan.done + len(plan.uncovered) * plan.trials_per_iter + sum(
            t.planned for t in plan.tasks
        )
        warnings.append(
            f"{plan.device_class}: the budget of {plan.budget} trials cannot cover every task: "
            f"{len(plan.uncovered)} of {len(plan.tasks)} get no trial and stay untuned "
            f"(naive loops); raise tuning.trials_per_class in the fleet file so that this class "
            f"gets at least {needed} trials for these models"
        )
    if not plan.boards:
        warnings.append(f"{plan.device_class}: no boards in the inventory; nothing can be measured")
    return ClassPlan(**{**plan.__dict__, "warnings": tuple(warnings)})


def _format_class(plan: ClassPlan) -> str:
    rows = [
        (t.name, f"{t.flops / 1e6:.2f}", f"{t.weight:g}", ",".join(t.models), t.done, t.planned)
        for t in plan.tasks
    ]
    header = (
        f"class {plan.device_class} ({plan.profile}): boards {', '.join(plan.boards) or '-'}\n"
        f"  models {', '.join(f'{m} ({b} trials)' for m, b in plan.model_budgets)}; "
        f"budget {plan.budget}, done {plan.done}, to run {plan.remaining} "
        f"({plan.trials_per_iter} per round, at most {plan.max_trials_per_task} per task)"
        + (f"; seeded from {plan.borrow_from}" if plan.borrow_from else "")
    )
    table = tabulate(rows, headers=("task", "MFLOP", "weight", "models", "done", "planned"))
    return "\n".join([header, table, *(f"warning: {w}" for w in plan.warnings)])
