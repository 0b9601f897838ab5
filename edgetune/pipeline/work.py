"""What a `tune-fleet` run has to do, found on this host alone: no board, simulated board,
tracker or cluster is contacted.

Per class, whether tuning has trials left: the tuning plan the tuner itself starts from
(`tune.plan.plan_tuning`: the class's tasks, its budget, the trials in its database; `remaining`
above 0 is what makes `tune` measure). Per (model, class), whether `build` would make a new
version: the build's own inputs (`artifact.release`: the model as imported, the profile, the
target, this host's TVM versions, the digest of a snapshot of the class database, the reference
input, the tolerance, edgetune's version) against the `inputs` of the latest stored version.
These are host facts only: the build's inputs hold nothing a board tells (the boards' TVM must
equal this host's, which `fleet up` checks; their firmware is `fleet status`'s and `regress`'s
business), so the answer is the one `build` would give with the fleet up.

The pairs are checked only when no class has trials left: a class that tunes changes its
database, and with it its pairs' inputs, so they are the build's to decide after the tuning.
Whatever cannot be told (a model that does not import, no database, a manifest that does not
read) counts as work: the whole job runs and reports it as it always did.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgetune.artifact.release import BuildOutcome, BuildPair, BuildReport, build_inputs, plan_builds
from edgetune.artifact.store import ArtifactStore, StoredVersion
from edgetune.artifact.tuning_inputs import snapshot_database
from edgetune.artifact_format.manifest import DATABASE_DIR, BuildInputs
from edgetune.compiler.models import import_model, reference_inputs
from edgetune.compiler.tasks import KernelTask
from edgetune.errors import EdgetuneError
from edgetune.inventory.schema import DeviceClass, Fleet, Model
from edgetune.tune.plan import ClassPlan, plan_tuning

log = logging.getLogger(__name__)

# What a check may raise that means "cannot tell" (TVM's errors are RuntimeErrors), as `build` catches them.
_CANNOT_TELL = (EdgetuneError, RuntimeError, ValueError, OSError)


@dataclass(frozen=True)
class ClassWork:
    """A class's tuning: its budget, the trials in its database, and the trials a run would measure."""

    device_class: str
    budget: int
    done: int
    remaining: int  # ClassPlan.remaining: above 0, `tune` measures on the boards
    time_is_the_budget: bool

    @property
    def to_do(self) -> bool:
        return self.remaining > 0

    @property
    def line(self) -> str:
        if self.time_is_the_budget and self.to_do:
            return (
                f"{self.device_class}: its time limit is its budget: about {self.remaining} trials to tune "
                f"({self.done} in the database)"
            )
        if self.to_do:
            return f"{self.device_class}: {self.remaining} trials left to tune ({self.done} of {self.budget} in the database)"
        return (
            f"{self.device_class}: its trial budget is spent ({self.done} trials in the database, budget {self.budget})"
        )


@dataclass(frozen=True)
class PairWork:
    """A (model, class)'s build: whether it would make a new version, and why."""

    model: str
    device_class: str
    to_do: bool  # a build would make a new version, or it cannot be told without building
    reason: str
    latest: StoredVersion | None = None  # the latest stored version (its inputs equal the current ones when not to_do)
    layout: str | None = None  # the layout the model is compiled in and why, as `build` reports it
    inputs: BuildInputs | None = None  # the build's inputs now (None: they could not be computed)

    @property
    def line(self) -> str:
        return f"{self.model} on {self.device_class}: {self.reason}"


@dataclass(frozen=True)
class Work:
    classes: tuple[ClassWork, ...]
    pairs: tuple[PairWork, ...]  # empty while a class has trials left (the build decides after tuning)

    @property
    def nothing(self) -> bool:
        """Every class's budget spent and every pair's inputs those of its latest version."""
        return not any(c.to_do for c in self.classes) and bool(self.pairs) and not any(p.to_do for p in self.pairs)

    def lines(self) -> list[str]:
        pairs = (
            [p.line for p in self.pairs]
            if self.pairs
            else ["the artifacts: built after the tuning, where their inputs changed"]
        )
        return [c.line for c in self.classes] + pairs

    def unchanged_report(self) -> BuildReport:
        """The table `build` would print: each pair's latest version, unchanged."""
        if not self.nothing:
            raise ValueError("there is work to do: only `build` can report it")
        return BuildReport(
            tuple(
                BuildOutcome.from_manifest("unchanged", p.latest.manifest, p.latest.path, layout=p.layout)
                for p in self.pairs
                if p.latest is not None
            )
        )


def find_work(
    fleet: Fleet,
    tasks_of: Callable[[Fleet, str, tuple[Model, ...]], tuple[KernelTask, ...]] | None = None,
) -> Work:
    """What `tune-fleet` would do on `fleet`, told on this host alone (`tasks_of`: as for
    `plan_tuning`, TVM's task extraction by default)."""
    plan = plan_tuning(fleet, tasks_of=tasks_of)
    classes = tuple(_class_work(c) for c in plan.classes)
    if any(c.to_do for c in classes):
        return Work(classes, ())
    return Work(classes, tuple(_pairs_work(fleet)))


def _class_work(plan: ClassPlan) -> ClassWork:
    return ClassWork(plan.device_class, plan.budget, plan.done, plan.remaining, plan.time_is_the_budget)


def _pairs_work(fleet: Fleet) -> list[PairWork]:
    """Each (model, class) `build` would build, checked as `build_pair` checks it before building."""
    store = ArtifactStore(fleet.artifacts.dir)
    imported: dict[str, tuple[object, str, dict] | Exception] = {}
    snapshots: dict[str, Path | Exception] = {}
    work = []
    with tempfile.TemporaryDirectory(prefix="edgetune-work-") as tmp:
        for model, device_class in plan_builds(fleet):
            if model.name not in imported:
                imported[model.name] = _attempt(lambda: _import(model))
            if device_class.name not in snapshots:
                into = Path(tmp) / device_class.name / DATABASE_DIR
                snapshots[device_class.name] = _attempt(lambda: snapshot_database(fleet, device_class.name, into))
            work.append(
                _pair_work(
                    fleet, store, model, device_class, imported[model.name], snapshots[device_class.name], Path(tmp)
                )
            )
    return work


def _import(model: Model) -> tuple[object, str, dict]:
    found = import_model(model)
    return found.mod, found.layout.line, reference_inputs(model)


def _attempt(make):
    try:
        return make()
    except _CANNOT_TELL as err:
        return err


def _pair_work(
    fleet: Fleet, store: ArtifactStore, model: Model, device_class: DeviceClass, imported, snapshot, tmp: Path
) -> PairWork:
    name, cls = model.name, device_class.name
    for failed in (imported, snapshot):
        if isinstance(failed, Exception):
            return PairWork(name, cls, True, f"to build (cannot tell without building: {failed})")
    mod, layout, ref_inputs = imported
    try:
        latest = store.latest(name, cls)
        inputs = build_inputs(BuildPair(fleet, model, device_class, mod, ref_inputs, tmp), snapshot)
    except _CANNOT_TELL as err:
        return PairWork(name, cls, True, f"to build (cannot tell without building: {err})", layout=layout)
    if latest is None:
        return PairWork(name, cls, True, "to build: no version yet", layout=layout, inputs=inputs)
    if latest.manifest.inputs_sha256 == inputs.digest():
        return PairWork(name, cls, False, f"unchanged since v{latest.version}", latest, layout, inputs)
    changed = changed_inputs(latest.manifest.inputs, inputs)
    return PairWork(
        name,
        cls,
        True,
        f"to build: {', '.join(changed) or 'its inputs'} changed since v{latest.version}",
        latest,
        layout,
        inputs,
    )


def changed_inputs(before: BuildInputs, now: BuildInputs) -> list[str]:
    """The names of the build inputs that differ ('database_sha256' reads 'database')."""
    return [
        f.name.removesuffix("_sha256")
        for f in dataclasses.fields(BuildInputs)
        if getattr(before, f.name) != getattr(now, f.name)
    ]
