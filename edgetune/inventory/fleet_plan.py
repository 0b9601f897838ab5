"""What `tune-fleet` will do, computed from the inventory alone: pure data, printable, testable.

Per device class: its boards and tracker, and the trial budget of each model (the class's
budget split by model weight). The tuner refines this per task once models are imported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from edgetune.inventory.schema import Fleet


@dataclass(frozen=True)
class ModelBudget:
    model: str
    weight: float
    trials: int


@dataclass(frozen=True)
class FleetClassPlan:
    """One device class's part of the fleet plan (before any model is imported)."""

    device_class: str
    profile: str
    target: dict
    tracker: str
    boards: tuple[str, ...]
    budgets: tuple[ModelBudget, ...]
    borrows_from: str | None

    @property
    def trials(self) -> int:
        return sum(b.trials for b in self.budgets)


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
        boards = fleet.boards_of(device_class.name)
        budget = split_budget(fleet.tuning.trials_for(device_class.name), weights)
        classes.append(
            FleetClassPlan(
                device_class=device_class.name,
                profile=device_class.profile.name,
                target=device_class.profile.target_json(),
                tracker=boards[0].tracker if boards else "",
                boards=tuple(b.name for b in boards),
                budgets=tuple(ModelBudget(m.name, m.weight, budget[m.name]) for m in fleet.models),
                borrows_from=fleet.tuning.borrow.get(device_class.name),
            )
        )
    return FleetPlan(fleet=fleet.name, classes=tuple(classes))
