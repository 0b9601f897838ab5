"""The tuning plan: which boards, models, tasks and trial budgets each device class gets, and
how long the run will take.

Pure data computed before anything is measured (`edgetune tune --dry-run` prints it).
Budgets (`TuningPolicy.task_budget_rule`): per task, every task gets `trials_per_task`; per
class, the class's `trials_per_class` is split over the fleet's models by weight, the selected
models' shares make the class budget, raised where needed to one round per task. Trials
already in the class database count (resume). The trials go round by round (`trials_per_iter`
each), never-measured tasks first and then by weighted cost, largest first, so every task gets
one round before any gets a second; a task whose recorded trials already show its knee gets
none, and its share is left to the tasks that still gain. `scheduler.BudgetScheduler` spends
them that way; the per-task `planned` figures are the plan's forecast of it. The time is the
trials to run at the rate the class's earlier runs measured.

A time budget (`budget.time_is_the_budget`: `time_limit_s` and no trial budget): every task is
planned one round, as far as the limit holds them at the measured rate, the round smaller than
`trials_per_iter` where the limit cannot hold that for every task (`budget.round_within_limit`);
the trials that fit after those (`by_gain`) go a round at a time to the task expected to gain
most, so the plan counts them but gives them to no task.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from tabulate import tabulate

from edgetune.compiler.tasks import KernelTask, class_task_list
from edgetune.inventory.fleet_plan import split_budget
from edgetune.inventory.schema import Fleet, Model, TuningPolicy
from edgetune.tune.budget import (
    DEFAULT_SECONDS_PER_TRIAL,
    UNBOUNDED_TRIALS,
    Throughput,
    estimate,
    first_rounds,
    reached_knee,
    round_within_limit,
    spread_rounds,
    suggest_time_limit,
    time_is_the_budget,
)
from edgetune.tune.database import (
    ClassDatabasePaths,
    TrialRecord,
    read_trials,
    throughput,
)


@dataclass(frozen=True)
class TaskPlan:
    name: str
    workload_hash: str
    flops: float
    weight: float
    models: tuple[str, ...]
    done: int  # trials already in the class database
    planned: int  # trials this run is expected to spend on it
    at_knee: bool = False  # its recorded trials show it stopped improving: it gets none


@dataclass(frozen=True)
class ClassPlan:
    device_class: str
    profile: str
    target: Mapping[str, object]
    boards: tuple[str, ...]  # the boards it is measured on: the class's tuning pool
    models: tuple[str, ...]
    model_budgets: tuple[tuple[str, int | None], ...]  # None: the budget is per task
    budget_rule: str  # how the budget was set, in words
    budget: int  # trials for the selected models, done ones included
    done: int
    remaining: int  # trials this run may measure: the planned, freed and by-gain ones
    freed: int  # shares of tasks at their knee, for the tasks that still gain
    by_gain: int  # time budget: trials expected to fit after a round each, dealt by expected gain
    time_limit_s: float | None
    time_is_the_budget: bool  # the run measures until its time limit (no trial budget)
    trials_per_iter: int
    max_trials_per_task: int | None  # a task's cap, trials moved to it included
    borrow_from: str | None
    tasks: tuple[TaskPlan, ...]  # in tuning order
    throughput: Throughput | None  # measured by earlier runs of the class
    estimate: str  # how long the run will take
    warnings: tuple[str, ...]

    @property
    def uncovered(self) -> tuple[TaskPlan, ...]:
        return tuple(t for t in self.tasks if t.done + t.planned == 0)

    def format(self) -> str:
        return _format_class(self)


@dataclass(frozen=True)
class TuningPlan:
    classes: tuple[ClassPlan, ...]

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(w for c in self.classes for w in c.warnings)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def format(self) -> str:
        return "\n\n".join(c.format() for c in self.classes)


def model_budgets(policy: TuningPolicy, device_class: str, models: tuple[Model, ...]) -> dict[str, int]:
    """The class's trials split over all the fleet's models by weight."""
    return split_budget(policy.trials_for(device_class), {m.name: m.weight for m in models})


def order_tasks(tasks: tuple[KernelTask, ...], done: Mapping[str, int]) -> tuple[KernelTask, ...]:
    """Never-measured tasks first, then largest weighted cost first (stable by name)."""
    return tuple(sorted(tasks, key=lambda t: (done.get(t.workload_hash, 0) > 0, -t.cost, t.name)))


def class_budget(
    policy: TuningPolicy, device_class: str, models: tuple[Model, ...], all_models: tuple[Model, ...], tasks: int
) -> tuple[int, int, str]:
    """(budget, trials a task's share may reach, the rule in words) for `tasks` tasks."""
    rule, trials = policy.task_budget_rule(device_class)
    if rule == "per_task":
        return trials * tasks, trials, f"{trials} trials per task x {tasks} tasks"
    shares = model_budgets(policy, device_class, all_models)
    class_wide = sum(shares[m.name] for m in models)
    one_round = tasks * policy.trials_per_iter
    cap = policy.max_trials_per_task or max(class_wide, one_round)
    if 0 < class_wide < one_round:
        return (
            one_round,
            cap,
            (
                f"{class_wide} trials per class, raised to {one_round} so that each of "
                f"{tasks} tasks gets a round of {policy.trials_per_iter}"
            ),
        )
    return class_wide, cap, f"{class_wide} trials per class over {tasks} tasks"


def plan_class(
    fleet: Fleet,
    device_class: str,
    models: tuple[Model, ...],
    tasks: tuple[KernelTask, ...],
    trials: Sequence[TrialRecord],
    measured: Throughput | None = None,
) -> ClassPlan:
    """The plan of one class from its deduplicated tasks, the trials already recorded (in
    measured order) and the trial rate of its earlier runs."""
    policy = fleet.tuning
    profile = fleet.device_class(device_class).profile
    done = Counter(t.workload_hash for t in trials)
    by_time = time_is_the_budget(policy, device_class)
    ordered = order_tasks(tasks, done)
    already = [done.get(t.workload_hash, 0) for t in ordered]  # every trial spent counts, even past the cap
    knee = [
        reached_knee([r.latency_s for r in trials if r.workload_hash == t.workload_hash], policy.early_stop)
        for t in ordered
    ]
    per_iter = policy.trials_per_iter
    if by_time:
        budget, rule, planned, by_gain, per_iter = _time_budget(policy, already, knee, measured)
    else:
        budget, cap, rule = class_budget(policy, device_class, models, fleet.models, len(tasks))
        per_task = policy.task_budget_rule(device_class)[0] == "per_task"
        remaining = sum(max(cap - d, 0) for d in already) if per_task else max(budget - sum(already), 0)
        planned, by_gain = spread_rounds(already, remaining, per_iter, cap), 0
    freed = sum(p for p, k in zip(planned, knee) if k)
    task_plans = tuple(
        TaskPlan(t.name, t.workload_hash, t.flops, t.weight, tuple(m for m, _ in t.uses), d, 0 if k else p, k)
        for t, d, p, k in zip(ordered, already, planned, knee)
    )
    to_run = sum(t.planned for t in task_plans) + freed + by_gain
    plan = ClassPlan(
        device_class=device_class,
        profile=str(profile.path),
        target=profile.target_json(),
        boards=tuple(b.name for b in fleet.pool_of(device_class)),
        models=tuple(m.name for m in models),
        model_budgets=tuple(
            (m.name, shares) for m, shares in _model_shares(policy, device_class, models, fleet.models)
        ),
        budget_rule=rule,
        budget=budget,
        done=sum(already),
        remaining=to_run,
        freed=freed,
        by_gain=by_gain,
        time_limit_s=policy.time_limit_s,
        time_is_the_budget=by_time,
        trials_per_iter=per_iter,
        max_trials_per_task=policy.max_trials_per_task,
        borrow_from=policy.borrow.get(device_class),
        tasks=task_plans,
        throughput=measured,
        estimate=_time_estimate(to_run, measured, policy.time_limit_s, by_time),
        warnings=(),
    )
    return _with_warnings(plan)


def _time_budget(
    policy: TuningPolicy, already: list[int], knee: list[bool], measured: Throughput | None
) -> tuple[int, str, list[int], int, int]:
    """(budget, rule in words, planned trials per task, trials dealt by expected gain, the
    round) of a run budgeted by its time: the trials that fit in the limit at the measured rate
    (a round for each task still gaining where no rate is measured yet: the first run measures
    it), in rounds the limit holds for every task (`round_within_limit`)."""
    limit = policy.time_limit_s
    cap = policy.max_trials_per_task or UNBOUNDED_TRIALS
    gaining = [d for d, k in zip(already, knee) if not k]
    per_iter = round_within_limit(policy.trials_per_iter, len(gaining), limit, measured)
    fit = (
        int(limit / measured.seconds_per_trial)
        if measured
        else sum(first_rounds(gaining, UNBOUNDED_TRIALS, per_iter, cap))
    )
    rounds = iter(first_rounds(gaining, fit, per_iter, cap))
    planned = [0 if k else next(rounds) for k in knee]
    room = sum(max(cap - d - p, 0) for d, p, k in zip(already, planned, knee) if not k)
    by_gain = min(fit - sum(planned), room)
    smaller = (
        f" (not {policy.trials_per_iter}: the limit holds no more for each of {len(gaining)} tasks at "
        f"{'the measured rate' if measured else f'a stated {DEFAULT_SECONDS_PER_TRIAL:g} s per trial'})"
        if per_iter < policy.trials_per_iter
        else ""
    )
    rule = (
        f"time limit of {_seconds(limit)}: a round of {per_iter} per task{smaller}, then rounds to the tasks "
        f"expected to gain most until the limit"
    )
    return sum(already) + sum(planned) + by_gain, rule, planned, by_gain, per_iter


def _time_estimate(trials: int, measured: Throughput | None, limit_s: float | None, by_time: bool) -> str:
    """How long the run takes: the trials at the measured rate, within `limit_s`."""
    if limit_s is None or trials == 0:
        return estimate(trials, measured)
    if by_time:
        return f"up to the time limit of {_seconds(limit_s)}: " + (
            f"{trials} trials at the measured rate, {estimate(trials, measured)}"
            if measured
            else "no run of this class has been measured yet (the first run measures the trial rate)"
        )
    if measured and trials * measured.seconds_per_trial > limit_s:
        return (
            f"{estimate(trials, measured)}; the time limit of {_seconds(limit_s)} ends it after about "
            f"{int(limit_s / measured.seconds_per_trial)} trials"
        )
    return f"{estimate(trials, measured)}, within the time limit of {_seconds(limit_s)}"


def _seconds(seconds: float) -> str:
    return f"{seconds:g} s" if seconds < 120 else f"{seconds:g} s ({seconds / 60:.0f} min)"


def _model_shares(policy, device_class, models, all_models) -> list[tuple[Model, int | None]]:
    """Each selected model's class-wide trials (None where the budget is per task)."""
    if policy.task_budget_rule(device_class)[0] == "per_task":
        return [(m, None) for m in models]
    shares = model_budgets(policy, device_class, all_models)
    return [(m, shares[m.name]) for m in models]


def plan_tuning(
    fleet: Fleet,
    classes: tuple[str, ...] | None = None,
    models: tuple[str, ...] | None = None,
    tasks_of: Callable[[Fleet, str, tuple[Model, ...]], tuple[KernelTask, ...]] | None = None,
) -> TuningPlan:
    """The plan for the selected classes and models (default: all). `tasks_of` defaults to
    extracting the tasks with TVM; the class databases give the trials done and the rate of
    earlier runs; nothing is measured and no machine is touched."""
    selected_models = select_models(fleet, models)
    return TuningPlan(
        tuple(
            plan_class(
                fleet,
                name,
                selected_models,
                (tasks_of or class_task_list)(fleet, name, selected_models),
                read_trials(ClassDatabasePaths.of(fleet.workdir, name)),
                throughput(ClassDatabasePaths.of(fleet.workdir, name)),
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
    if plan.uncovered and plan.time_is_the_budget:
        needed = suggest_time_limit(len(plan.tasks), plan.trials_per_iter, plan.throughput).time_limit_s
        warnings.append(
            f"{plan.device_class}: {len(plan.uncovered)} of {len(plan.tasks)} tasks get no trial within the time "
            f"limit at the measured rate and stay untuned (naive loops): set tuning.time_limit_s to {needed} "
            f"for a round of {plan.trials_per_iter} each"
        )
    elif plan.uncovered:
        warnings.append(
            f"{plan.device_class}: {len(plan.uncovered)} of {len(plan.tasks)} tasks get no trial and "
            f"stay untuned (naive loops): the budget ({plan.budget_rule}) or tuning.max_trials_per_task "
            f"({plan.max_trials_per_task}) is too small for a round of {plan.trials_per_iter} each"
        )
    if not plan.boards:
        warnings.append(f"{plan.device_class}: no boards in the inventory; nothing can be measured")
    return ClassPlan(**{**plan.__dict__, "warnings": tuple(warnings)})


def _format_class(plan: ClassPlan) -> str:
    rows = [
        (
            t.name,
            f"{t.flops / 1e6:.2f}",
            f"{t.weight:g}",
            ",".join(t.models),
            t.done,
            f"{t.planned} (at its knee)" if t.at_knee else t.planned,
        )
        for t in plan.tasks
    ]
    cap = f", at most {plan.max_trials_per_task} per task" if plan.max_trials_per_task else ""
    header = (
        f"class {plan.device_class} ({plan.profile}): boards {', '.join(plan.boards) or '-'}\n"
        f"  models {', '.join(plan.models)}; budget {plan.budget} ({plan.budget_rule}), done {plan.done}, "
        f"to run {plan.remaining} ({plan.trials_per_iter} per round{cap})"
        + (f"; seeded from {plan.borrow_from}" if plan.borrow_from else "")
        + (f"\n  {plan.freed} trials of tasks at their knee go to the tasks that still gain" if plan.freed else "")
        + (
            f"\n  {plan.by_gain} trials after a round each go to the tasks expected to gain most"
            if plan.by_gain
            else ""
        )
        + f"\n  time: {plan.estimate}"
    )
    table = tabulate(rows, headers=("task", "MFLOP", "weight", "models", "done", "planned"))
    return "\n".join([header, table, *(f"warning: {w}" for w in plan.warnings)])
