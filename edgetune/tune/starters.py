"""Starter records: a device profile's database of good schedules for common kernels, which seeds
the tasks of a class run that have no trial yet.

`build_starters` keeps the best `top_k` records of every kernel of some tuned class databases, in
the class database format (MetaSchedule's JSON database), in `starters/<profile name>/` beside the
profile file (`starters_dir`). A class run of that profile (`StarterTraces`, through
`borrow.seed_tasks`, after borrowing) seeds each task still without a trial:
- exact: a starter kernel structurally equal to the task's: its best traces, replayed;
- transfer: starter kernels of the task's kind (`signature`) at other shapes, the nearest first
  (`shape_distance`): their traces replayed on the task's kernel with each SamplePerfectTile
  decision adapted to the extent of its loop there (`adapt_tile`) and every other decision kept.
  A trace that does not apply is dropped; replays that come out the same module are measured once.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.prepare import kernel_hash
from edgetune.errors import TuneError
from edgetune.inventory.schema import DeviceProfile, Fleet
from edgetune.tune.borrow import EXACT, TRANSFER, DecisionProvider, Seeds, replay
from edgetune.tune.database import FAILED_RUN_SECS, ClassDatabasePaths, open_database, records_by_kernel, snapshot

_LITERAL = re.compile(r"\b\d+\b")
# a name's number (lv221, param_0, T_add_1: where the kernel sat in its model), not a dtype's width
_NUMBERED_NAME = re.compile(r"\b(?!(?:u?int|float|bfloat)\d+\b)([A-Za-z_]\w*?)\d+\b")


def starters_dir(profile: DeviceProfile) -> Path:
    """Where a profile's starter records live: `starters/<name>/` beside the profile file."""
    return profile.path.parent / "starters" / profile.name


def signature(mod: tvm.IRModule) -> str:
    """A kernel's kind: its TVMScript with every integer literal, and the number ending a name,
    written N. Block names, the loop nest, the operations, dtypes and ranks stay; shapes, extents,
    constants and the numbers a model's import gave its values (lv221, param_0) go (a stride of 2
    and one of 3 are alike, a stride of 1, written without a multiplication, is not)."""
    return _LITERAL.sub("N", _NUMBERED_NAME.sub(r"\1N", _script(mod)))


def shape_distance(a: Sequence[int], b: Sequence[int]) -> float:
    """How far apart two kernels of one signature are: the sum over their integer literals, in
    order, of the distance of their logarithms (so 64 -> 128 is as far as 8 -> 16)."""
    return sum(abs(math.log1p(x) - math.log1p(y)) for x, y in zip(a, b))


def adapt_tile(factors: Sequence[int], extent: int, max_innermost: int) -> list[int]:
    """A SamplePerfectTile decision for a loop of `extent`, from one made for another extent: from
    the innermost out, each donor factor is kept where it divides what is left of the extent,
    else the largest divisor of it below the factor is taken; the outermost takes the rest. The
    innermost is at most `max_innermost` (none when it is not positive); the product is `extent`."""
    if extent < 1 or not factors:
        raise ValueError(f"a tile of {len(factors)} factors for an extent of {extent}")
    rest = extent
    inner: list[int] = []
    for position, factor in enumerate(reversed(factors[1:])):
        cap = min(factor, max_innermost) if position == 0 and max_innermost > 0 else factor
        kept = _largest_divisor(rest, max(cap, 1))
        inner.append(kept)
        rest //= kept
    return [rest, *reversed(inner)]


def _largest_divisor(number: int, at_most: int) -> int:
    return next(d for d in range(min(number, at_most), 0, -1) if number % d == 0)


def adapted_tiles(sch: tvm.s_tir.Schedule) -> DecisionProvider:
    """The decision provider of a transferred replay on `sch`: SamplePerfectTile decisions
    adapted to the extent of their loop in `sch` (`adapt_tile`), every other decision kept."""

    def provide(inst, inputs, attrs, decision):
        if inst.kind.name != "SamplePerfectTile" or decision is None:
            return decision
        extent = sch.get(inputs[0]).extent
        if not isinstance(extent, tvm.tirx.IntImm):
            return decision
        return adapt_tile([int(f) for f in decision], int(extent.value), int(attrs[1]))

    return provide


@dataclass(frozen=True)
class StarterKernel:
    signature: str
    literals: tuple[int, ...]
    traces: tuple[tvm.s_tir.schedule.Trace, ...]  # best first


class StarterTraces:
    """A starter database as a source of traces for `borrow.seed_tasks`."""

    def __init__(self, kernels: dict[str, StarterKernel]) -> None:
        self.kernels = kernels  # by workload hash
        self.by_signature: dict[str, list[StarterKernel]] = {}
        for kernel in kernels.values():
            self.by_signature.setdefault(kernel.signature, []).append(kernel)

    @classmethod
    def open(cls, directory: Path) -> StarterTraces:
        """The starter records of `directory`; a TuneError names it when it holds no database."""
        paths = _database_paths(directory, "starter records")
        kernels = {}
        for workload_hash, records in records_by_kernel(open_database(paths)).items():
            mod = records[0].workload.mod
            kernels[workload_hash] = StarterKernel(
                signature(mod), _literals(mod), tuple(r.trace for r in _best_first(records))
            )
        return cls(kernels)

    def seeds(self, mod: tvm.IRModule, count: int) -> Seeds | None:
        same = self.kernels.get(kernel_hash(mod))
        if same is not None:
            return Seeds(EXACT, _unique(mod, same.traces, count))
        kind = self.by_signature.get(signature(mod))
        if not kind:
            return None
        shape = _literals(mod)
        nearest = sorted(kind, key=lambda k: shape_distance(k.literals, shape))
        return Seeds(TRANSFER, _unique(mod, [t for k in nearest for t in k.traces], count, adapted_tiles))


def _unique(
    mod: tvm.IRModule,
    traces: Iterable[tvm.s_tir.schedule.Trace],
    count: int,
    decisions: Callable[[tvm.s_tir.Schedule], DecisionProvider] | None = None,
) -> list[tvm.s_tir.Schedule]:
    """Up to `count` schedules of `mod` replayed from `traces` in order, each module once."""
    schedules: list[tvm.s_tir.Schedule] = []
    seen: set[str] = set()
    for trace in traces:
        if len(schedules) == count:
            break
        sch = replay(mod, trace, decisions)
        if sch is not None and (key := kernel_hash(sch.mod)) not in seen:
            seen.add(key)
            schedules.append(sch)
    return schedules


@dataclass(frozen=True)
class StarterBuild:
    directory: Path
    kernels: int
    records: int


def build_starters(
    fleet: Fleet, profile_name: str, sources: Sequence[Path], top_k: int, out: Path | None = None
) -> StarterBuild:
    """Write the best `top_k` measured records of every kernel of the class databases `sources`
    as the starter records of the fleet's profile `profile_name`, to `out` (default:
    `starters_dir`), replacing what was there. Bad input raises a TuneError before anything is
    written."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise TuneError(f"--top-k: the records kept per kernel, a whole number of at least 1, got {top_k!r}")
    profile = _profile(fleet, profile_name)
    if not sources:
        raise TuneError("--from: name at least one class database directory (<workdir>/databases/<class>)")
    for source in sources:
        _database_paths(Path(source), "class database")
    directory = Path(out) if out is not None else starters_dir(profile)
    with tempfile.TemporaryDirectory(prefix="edgetune-starters-") as scratch:
        best = _best_records(sources, Path(scratch), top_k)
        if not best:
            raise TuneError(f"--from {' '.join(map(str, sources))}: no measured record in these databases; tune first")
        _write_atomically(directory, best)
    return StarterBuild(directory, len(best), sum(len(records) for records in best.values()))


def _profile(fleet: Fleet, name: str) -> DeviceProfile:
    profiles = {c.profile.name: c.profile for c in fleet.device_classes}
    if name not in profiles:
        raise TuneError(
            f"--profile {name!r}: no device class of {fleet.path} has that profile "
            f"(its profiles: {', '.join(sorted(profiles))})"
        )
    return profiles[name]


def _database_paths(directory: Path, what: str) -> ClassDatabasePaths:
    paths = ClassDatabasePaths(directory)
    if not directory.is_dir():
        raise TuneError(f"{directory}: no such directory (it should be a {what} directory)")
    missing = [p.name for p in (paths.workload, paths.tuning_record) if not p.is_file()]
    if missing:
        raise TuneError(
            f"{directory}: not a {what} directory: it has no {' or '.join(missing)} "
            f"(a class database is <workdir>/databases/<class>)"
        )
    return paths


def _best_records(sources: Sequence[Path], scratch: Path, top_k: int) -> dict[str, list[ms.database.TuningRecord]]:
    """The best `top_k` measured records of every kernel of the databases, across them all (a
    trace found in several, once)."""
    by_kernel: dict[str, list[ms.database.TuningRecord]] = {}
    for index, source in enumerate(sources):
        database = open_database(snapshot(ClassDatabasePaths(Path(source)), scratch / str(index)))
        for workload_hash, records in records_by_kernel(database).items():
            by_kernel.setdefault(workload_hash, []).extend(r for r in records if _seconds(r) < FAILED_RUN_SECS)
    return {h: _distinct(_best_first(records))[:top_k] for h, records in by_kernel.items() if records}


def _distinct(records: list[ms.database.TuningRecord]) -> list[ms.database.TuningRecord]:
    seen: set[str] = set()
    kept = []
    for record in records:
        key = str(record.trace)  # its instructions and decisions
        if key not in seen:
            seen.add(key)
            kept.append(record)
    return kept


def _write_atomically(directory: Path, best: dict[str, list[ms.database.TuningRecord]]) -> None:
    """The records as a JSON database in a new directory beside `directory`, then put in its place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        paths = ClassDatabasePaths(new)
        database = ms.database.JSONDatabase(
            path_workload=str(paths.workload), path_tuning_record=str(paths.tuning_record), allow_missing=True
        )
        for records in best.values():
            workload = database.commit_workload(records[0].workload.mod)
            for record in records:
                database.commit_tuning_record(
                    ms.database.TuningRecord(record.trace, workload, record.run_secs, record.target, record.args_info)
                )
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
            new.rename(directory)
            shutil.rmtree(old)
        else:
            new.rename(directory)
    finally:
        shutil.rmtree(new, ignore_errors=True)


def _best_first(records: Iterable[ms.database.TuningRecord]) -> list[ms.database.TuningRecord]:
    return sorted(records, key=_seconds)


def _seconds(record: ms.database.TuningRecord) -> float:
    secs = [float(s) for s in record.run_secs or ()]
    return sum(secs) / len(secs) if secs else math.inf


def _script(mod: tvm.IRModule) -> str:
    return "\n".join(mod[g].script() for g in sorted(mod.get_global_vars(), key=lambda g: g.name_hint))


def _literals(mod: tvm.IRModule) -> tuple[int, ...]:
    return tuple(int(n) for n in _LITERAL.findall(_script(mod)))
