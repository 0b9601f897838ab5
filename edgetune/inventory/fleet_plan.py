"""What `tune-fleet` will do, computed from the inventory alone: pure data, printable, testable.

Per device class: its boards, those of its tuning pool (the others only run releases) and the
tracker they are measured through, and the trial budget of each model (the class's
budget split by model weight), or the trials each task gets where the budget is per task (the
class total then depends on the task count: `edgetune tune --dry-run` imports the models).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edgetune.inventory.schema import TARGET, Fleet


@dataclass(frozen=True)
class ModelBudget:
    model: str
    weight: float
    trials: int | None  # None: the budget is per task


@dataclass(frozen=True)
class FleetClassPlan:
    """One device class's part of the fleet plan (before any model is imported)."""

    device_class: str
    profile: str
    target: dict
    tracker: str
    boards: tuple[str, ...]  # every board of the class
    tuning_pool: tuple[str, ...]  # the boards that tune and measure builds; the others are targets only
    budgets: tuple[ModelBudget, ...]
    borrows_from: str | None
    trials_per_task: int | None = None  # set where the budget is per task

    @property
    def trials(self) -> int | None:
        return None if self.trials_per_task else sum(b.trials or 0 for b in self.budgets)

    def boards_text(self) -> str:
        """The class's boards, each outside the tuning pool marked: 'lab-1, lab-2, field-1 (target)'."""
        return ", ".join(name if name in self.tuning_pool else f"{name} ({TARGET})" for name in self.boards)


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    classes: tuple[FleetClassPlan, ...]

    def to_json(self) -> dict:
        return asdict(self)


def split_budget(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split `total` trials over models in proportion to their weights (largest remainder),
    so the parts always add up to the total."""
    weight_sum = sum(weights.values())
    shares = {name: total * w / weight_sum for name, w in weights.items()}
    budget = {name: int(share) for name, share in shares.items()}
    leftover = total - sum(budget.values())
    for name in sorted(shares, key=lambda n: (budget[n] - shares[n], n))[:leftover]:
        budget[name] += 1
    return budget


def plan_fleet(fleet: Fleet) -> FleetPlan:
    weights = {m.name: m.weight for m in fleet.models}
    classes = []
    for device_class in fleet.device_classes:
        boards, pool = fleet.boards_of(device_class.name), fleet.pool_of(device_class.name)
        rule, trials = fleet.tuning.task_budget_rule(device_class.name)
        budget = split_budget(trials, weights) if rule == "per_class" else {}
        classes.append(
            FleetClassPlan(
                device_class=device_class.name,
                profile=device_class.profile.name,
                target=device_class.profile.target_json(),
                tracker=pool[0].tracker if pool else "",
                boards=tuple(b.name for b in boards),
                tuning_pool=tuple(b.name for b in pool),
                budgets=tuple(ModelBudget(m.name, m.weight, budget.get(m.name)) for m in fleet.models),
                borrows_from=fleet.tuning.borrow.get(device_class.name),
                trials_per_task=trials if rule == "per_task" else None,
            )
        )
    return FleetPlan(fleet=fleet.name, classes=tuple(classes))
