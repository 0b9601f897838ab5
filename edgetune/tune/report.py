"""Tuning reports: per class and model a task table, a tuning-curve PNG and `summary.json`,
all under `<fleet.workdir>/reports/<class>/<model>/`, and the live progress line per class.

Everything is computed from the class database (the trials in the order they were measured),
so a report is the same whether the trials came from one run or several resumed ones.
The model latency estimate is the sum over its kernels of calls x best measured latency, plus
the kernels `prepare` scheduled itself (never searched: each at the time measured with the
untuned kernels, `scheduled_latency`); it exists once every searched kernel of the model has a
measured schedule. Before that, the early curve
(`early_curve`) counts each kernel not measured yet at its untuned time (measured on the boards
at the class run's start, `untuned.py`), or, where that measurement failed, at its first
measured latency: the curve starts at trial 0, the untuned model, its early part marked as such.

Time to parity (`parity_point`): for an ONNX model, the first point of the estimate, counted
whenever every kernel of the model is in it (a kernel not measured yet at its untuned time), that
is at most the time of the faster runtime the board would otherwise run it with (onnxruntime or
OpenVINO, timed on a board of the class at a class run's start: `parity.py`), with the minute of
the class's tuning at which it was recorded (`parity_minute`). The estimate is a sum of kernel
times, as the curve's: the built library adds the VM's calls between kernels, which the build's
"vs best runtime" measures.

`summary.json` is a `TuningSummary` (schema `edgetune.tuning-summary`, version 1), decoded by
the schema codec wherever it is read (`read_summary`); a summary without the schema keys, as
written before they existed, is read as version 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tabulate import tabulate

from edgetune.artifact_format.codec import FrozenMap, load_versioned, rule, to_json
from edgetune.compiler.tasks import KernelTask
from edgetune.durable import write_atomic
from edgetune.errors import TuneError
from edgetune.tune.database import ClockLine, RuntimeTime, TrialRecord

SUMMARY_SCHEMA = "edgetune.tuning-summary"
SUMMARY_VERSION = 1
WITHIN = 0.10  # "within 10 % of the final latency"
NOT_MEASURED = "not measured"  # time to parity of a model no runtime was timed for (no ONNX file, or no runtime)
NOT_YET = "not yet"  # time to parity of a model still slower than its faster runtime


@dataclass(frozen=True)
class CurvePoint:
    trials: int  # trials spent on this model's kernels so far
    latency_s: float  # estimated model latency after them


@dataclass(frozen=True)
class EarlyPoint:
    trials: int
    latency_s: float  # with the kernels not measured yet at their untuned (or first measured) latency
    stand_ins: int  # how many kernels were not measured yet
    untuned: int = 0  # how many of those count at their untuned time


def _points(*lengths: int):
    """A check that each point of a curve has one of `lengths` numbers."""

    def check(points: tuple[tuple[float, ...], ...]) -> str | None:
        bad = next((i for i, point in enumerate(points) if len(point) not in lengths), None)
        if bad is None:
            return None
        return f"point {bad} has {len(points[bad])} numbers, not {' or '.join(map(str, lengths))}"

    return check


@dataclass(frozen=True)
class TaskRow:
    """One kernel of a model in its report."""

    name: str
    workload_hash: str
    flops: float
    calls: int  # in the model
    trials: int  # on the class's database, for all its models
    failed_trials: int
    best_latency_s: float | None
    gflops: float | None
    stopped: str | None  # why the last run gave it no more trials (None: it was not stopped)


@dataclass(frozen=True)
class KneePoint:
    trials: int
    latency_s: float


@dataclass(frozen=True)
class ParityPoint:
    """When the model's estimate first was at most its faster runtime's time on the board."""

    trial: int  # trials spent on the model's kernels then, as the curve counts them (0: the untuned model)
    minute: float | None  # the class's tuning time then (`parity_minute`); None where it was not clocked
    runtime: str  # the faster runtime's name
    runtime_s: float
    estimate_s: float

    def text(self) -> str:
        """'trial 12, 3.1 min vs openvino'."""
        minute = "" if self.minute is None else f", {self.minute:.1f} min"
        return f"trial {self.trial}{minute} vs {self.runtime}"


@dataclass(frozen=True)
class TuningSummary:
    """`summary.json`: one model's tuning on one class, over every run so far."""

    device_class: str
    model: str
    trials: int
    trials_this_run: int
    tuning_time_s: float  # over every run
    tasks_total: int
    tasks_tuned: int  # with a measured schedule
    estimated_latency_s: float | None  # once every kernel has a measured schedule
    tasks: tuple[TaskRow, ...]
    curve: tuple[tuple[float, ...], ...] = rule(check=_points(2))  # [trials, latency_s] per CurvePoint
    early_curve: tuple[tuple[float, ...], ...] = rule(
        (), check=_points(3, 4)
    )  # [trials, latency_s, stand_ins, untuned]
    knee: KneePoint | None = None
    trials_to_within_10pct: int | None = None
    borrowed_from: str | None = None  # kept by later runs
    starter_trials: int = 0  # trials spent on the model's kernels measuring starter records, over every run
    stopped: str | None = None  # why the last run stopped early
    firmware: Mapping[str, str] = field(default_factory=FrozenMap)  # per board, as of its last run
    target: Mapping[str, Any] = field(default_factory=FrozenMap)
    database: str | None = None
    untuned_latency_s: float | None = None
    # the kernels `prepare` scheduled itself, in every estimate above (None: not measured, left out)
    scheduled_latency_s: float | None = None
    # runtime name -> its time on a board of the class, measured at a class run's start (ONNX models)
    runtimes: Mapping[str, RuntimeTime] = field(default_factory=FrozenMap)
    parity: ParityPoint | None = None
    time_to_parity: str = NOT_MEASURED  # `parity_text`: "trial 12, 3.1 min vs openvino", "not yet", "not measured"

    def curve_points(self) -> list[CurvePoint]:
        return [CurvePoint(int(p[0]), p[1]) for p in self.curve]

    def early_points(self) -> list[EarlyPoint]:
        return [EarlyPoint(int(p[0]), p[1], int(p[2]), int(p[3]) if len(p) > 3 else 0) for p in self.early_curve]


@dataclass(frozen=True)
class RunInfo:
    """What the tuner knows about the run beyond the database."""

    device_class: str
    target: dict
    database_dir: str
    borrowed_from: str | None  # the class whose schedules this run borrowed, if it borrowed any
    trials_this_run: int
    tuning_time_s: float
    stopped: str | None  # why the run stopped early (time limit, no boards), or None
    firmware: dict[str, str]  # board -> firmware fingerprint the run's measurements were taken under
    task_stops: dict[str, str]  # workload hash -> why the run gave that task no more trials
    # workload hash -> trials this run spent measuring its starter records
    starter_trials: Mapping[str, int] = field(default_factory=dict)


def model_curve(
    tasks: tuple[KernelTask, ...], model: str, trials: list[TrialRecord], scheduled_s: float = 0.0
) -> list[CurvePoint]:
    """Estimated model latency after each trial on one of its kernels, once all are measured;
    `scheduled_s`: the time of the kernels `prepare` scheduled itself (`scheduled_latency`)."""
    calls = model_calls(tasks, model)
    return [
        CurvePoint(spent, scheduled_s + sum(calls[h] * best[h] for h in calls))
        for _, spent, best in _best_after_each_trial(calls, trials)
        if len(best) == len(calls)
    ]


def early_curve(
    tasks: tuple[KernelTask, ...],
    model: str,
    trials: list[TrialRecord],
    untuned: Mapping[str, float | None] = MappingProxyType({}),
    scheduled_s: float = 0.0,
) -> list[EarlyPoint]:
    """The estimate before every kernel of the model was measured: at trial 0 when every kernel
    has an untuned time, then after each trial. A kernel not measured yet counts at its untuned
    time, or without one at its first measured latency; kernels with neither are left out.
    `scheduled_s` as `model_curve`'s."""
    calls = model_calls(tasks, model)
    at_untuned = {h: s for h, s in untuned.items() if h in calls and s is not None}
    stand_in = dict(at_untuned)
    for trial in trials:
        if trial.workload_hash in calls and trial.latency_s is not None:
            stand_in.setdefault(trial.workload_hash, trial.latency_s)
    start = untuned_latency(tasks, model, untuned)
    curve = [] if start is None else [EarlyPoint(0, scheduled_s + start, len(calls), len(calls))]
    for _, spent, best in _best_after_each_trial(calls, trials):
        if len(best) == len(calls):
            break
        waiting = [h for h in stand_in if h not in best]
        latency = scheduled_s + sum(calls[h] * best.get(h, stand_in[h]) for h in stand_in)
        curve.append(EarlyPoint(spent, latency, len(waiting), sum(h in at_untuned for h in waiting)))
    return curve


def untuned_latency(tasks: tuple[KernelTask, ...], model: str, untuned: Mapping[str, float | None]) -> float | None:
    """The model at every kernel's untuned time; None unless each has one."""
    calls = model_calls(tasks, model)
    if any(untuned.get(h) is None for h in calls):
        return None
    return sum(calls[h] * untuned[h] for h in calls)


def scheduled_latency(
    scheduled: tuple[KernelTask, ...], model: str, untuned: Mapping[str, float | None]
) -> float | None:
    """The time of the model's kernels `prepare` scheduled itself: never searched, each counts
    at the time measured with the untuned kernels (`untuned.py`). 0.0 where the model has none;
    None while one of them has no time (the estimates then leave them out)."""
    return untuned_latency(scheduled, model, untuned)


def model_calls(tasks: tuple[KernelTask, ...], model: str) -> dict[str, int]:
    """Calls of each of the model's kernels, by workload hash."""
    return {t.workload_hash: t.calls_in(model) for t in tasks if t.calls_in(model)}


def _best_after_each_trial(
    calls: Mapping[str, int], trials: list[TrialRecord]
) -> Iterator[tuple[int, int, dict[str, float]]]:
    """After each trial on one of `calls`' kernels: its position in `trials`, the trials spent
    on them, and the best latency measured so far per kernel (one dict, updated in place)."""
    best: dict[str, float] = {}
    spent = 0
    for position, trial in enumerate(trials):
        if trial.workload_hash not in calls:
            continue
        spent += 1
        if trial.latency_s is not None and trial.latency_s < best.get(trial.workload_hash, float("inf")):
            best[trial.workload_hash] = trial.latency_s
        yield position, spent, best


def whole_estimates(
    tasks: tuple[KernelTask, ...],
    model: str,
    trials: list[TrialRecord],
    untuned: Mapping[str, float | None],
    scheduled_s: float = 0.0,
) -> Iterator[tuple[int | None, int, float]]:
    """The model's estimate wherever every kernel of it counts (a kernel not measured yet at its
    untuned time): (the trial's position in `trials`, None for trial 0; the trials spent on the
    model's kernels, as the curve counts them; the estimate in seconds). `scheduled_s` as
    `model_curve`'s."""
    calls = model_calls(tasks, model)
    if not calls:
        return
    start = untuned_latency(tasks, model, untuned)
    if start is not None:
        yield None, 0, scheduled_s + start
    for position, spent, best in _best_after_each_trial(calls, trials):
        stand_in = {h: best[h] if h in best else untuned.get(h) for h in calls}
        if all(seconds is not None for seconds in stand_in.values()):
            yield position, spent, scheduled_s + sum(calls[h] * seconds for h, seconds in stand_in.items())


def parity_point(
    tasks: tuple[KernelTask, ...],
    model: str,
    trials: list[TrialRecord],
    untuned: Mapping[str, float | None],
    runtimes: Mapping[str, RuntimeTime],
    clock: Sequence[ClockLine] = (),
    scheduled_s: float = 0.0,
) -> ParityPoint | None:
    """The first estimate of the model (`whole_estimates`) at most the faster runtime's time,
    and when it was recorded (`parity_minute`); None while none is, or without a runtime time.
    `scheduled_s` as `model_curve`'s."""
    faster = fastest_runtime(runtimes)
    if faster is None:
        return None
    fastest, bar = faster
    for position, spent, estimate in whole_estimates(tasks, model, trials, untuned, scheduled_s):
        if estimate <= bar:
            minute = parity_minute(clock, position, _first_trial(tasks, model, trials))
            return ParityPoint(spent, minute, fastest, bar, estimate)
    return None


def fastest_runtime(runtimes: Mapping[str, RuntimeTime]) -> tuple[str, float] | None:
    """The faster runtime's name and time in seconds; None without one."""
    if not runtimes:
        return None
    name = min(runtimes, key=lambda n: runtimes[n].seconds)
    return name, runtimes[name].seconds


def _first_trial(tasks: tuple[KernelTask, ...], model: str, trials: list[TrialRecord]) -> int:
    """The position in `trials` of the first trial on one of the model's kernels (past the end: none)."""
    calls = model_calls(tasks, model)
    return next((i for i, trial in enumerate(trials) if trial.workload_hash in calls), len(trials))


def parity_minute(clock: Sequence[ClockLine], position: int | None, first_trial: int) -> float | None:
    """The class's tuning time, in minutes, at which the trial at `position` of the record file
    was recorded: that of the first clock line counting it, the round that recorded it (None
    where that is a run's start mark: the trial was recorded before the clock was kept). Trial 0
    (`position` None) was known once the run that measured the model's untuned kernels and
    runtimes had done so: the last start mark at or before the model's first trial
    (`first_trial`, its position)."""
    if position is None:
        marks = [line for line in clock if line.start and line.trials <= first_trial]
        return marks[-1].seconds / 60 if marks else None
    line = next((line for line in clock if line.trials > position), None)
    return None if line is None or line.start else line.seconds / 60


def parity_text(runtimes: Mapping[str, RuntimeTime], parity: ParityPoint | None) -> str:
    """'trial 12, 3.1 min vs openvino'; NOT_YET while slower than the faster runtime; NOT_MEASURED without one."""
    if parity is not None:
        return parity.text()
    return NOT_YET if runtimes else NOT_MEASURED


def knee(curve: list[CurvePoint]) -> CurvePoint | None:
    """The point farthest below the chord from the first to the last point (Kneedle)."""
    if len(curve) < 3:
        return curve[-1] if curve else None
    first, last = curve[0], curve[-1]
    span_x = max(last.trials - first.trials, 1)
    span_y = (first.latency_s - last.latency_s) or 1.0

    def gap(p: CurvePoint) -> float:
        x = (p.trials - first.trials) / span_x
        y = (first.latency_s - p.latency_s) / span_y
        return y - x

    return max(curve, key=gap)


def trials_to_within(curve: list[CurvePoint], fraction: float = WITHIN) -> int | None:
    """Trials until the estimate first came within `fraction` of its final value."""
    if not curve:
        return None
    target = curve[-1].latency_s * (1.0 + fraction)
    return next(p.trials for p in curve if p.latency_s <= target)


def task_rows(
    tasks: tuple[KernelTask, ...], model: str, trials: list[TrialRecord], stops: Mapping[str, str]
) -> list[TaskRow]:
    """Per kernel of the model: FLOPs, calls, trials (all models), best latency, GFLOP/s, and why
    the last run gave it no more trials (`stops`, by workload hash; None: it was not stopped)."""
    rows = []
    for task in tasks:
        if not task.calls_in(model):
            continue
        own = [t for t in trials if t.workload_hash == task.workload_hash]
        valid = [t.latency_s for t in own if t.latency_s is not None]
        best = min(valid) if valid else None
        rows.append(
            TaskRow(
                task.name,
                task.workload_hash,
                task.flops,
                task.calls_in(model),
                len(own),
                len(own) - len(valid),
                best,
                task.flops / best / 1e9 if best else None,
                stops.get(task.workload_hash),
            )
        )
    return rows


def write_model_report(
    directory: Path,
    model: str,
    tasks: tuple[KernelTask, ...],
    trials: list[TrialRecord],
    run: RunInfo,
    untuned: Mapping[str, float | None] = MappingProxyType({}),
    runtimes: Mapping[str, RuntimeTime] = MappingProxyType({}),
    clock: Sequence[ClockLine] = (),
    scheduled: tuple[KernelTask, ...] = (),
) -> Path:
    """Write table.txt, curve.png and summary.json for one model; return the summary path.
    `untuned`: the kernels' untuned times by workload hash (`database.untuned_times`);
    `runtimes`: the model's runtime times on the board (none: time to parity not measured) and
    `clock` the class's clock (`database.clock_lines`), for the time to parity; `scheduled`: the
    class's kernels `prepare` scheduled itself, whose times (in `untuned`) every estimate adds."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = task_rows(tasks, model, trials, run.task_stops)
    fixed = scheduled_latency(scheduled, model, untuned)
    scheduled_s = fixed or 0.0
    curve = model_curve(tasks, model, trials, scheduled_s)
    early = early_curve(tasks, model, trials, untuned, scheduled_s)
    summary_path = directory / "summary.json"
    previous = read_summary(summary_path) if summary_path.exists() else None
    knee_point = knee(curve)
    parity = parity_point(tasks, model, trials, untuned, runtimes, clock, scheduled_s)
    untuned_s = untuned_latency(tasks, model, untuned)
    summary = TuningSummary(
        device_class=run.device_class,
        model=model,
        trials=sum(r.trials for r in rows),
        trials_this_run=run.trials_this_run,
        tuning_time_s=round((previous.tuning_time_s if previous else 0.0) + run.tuning_time_s, 3),
        tasks_total=len(rows),
        tasks_tuned=sum(1 for r in rows if r.best_latency_s is not None),
        estimated_latency_s=curve[-1].latency_s if curve else None,
        tasks=tuple(rows),
        curve=tuple((p.trials, p.latency_s) for p in curve),
        early_curve=tuple((p.trials, p.latency_s, p.stand_ins, p.untuned) for p in early),
        knee=KneePoint(knee_point.trials, knee_point.latency_s) if knee_point else None,
        trials_to_within_10pct=trials_to_within(curve),
        borrowed_from=run.borrowed_from or (previous.borrowed_from if previous else None),
        starter_trials=(previous.starter_trials if previous else 0)
        + sum(run.starter_trials.get(t.workload_hash, 0) for t in tasks if t.calls_in(model)),
        stopped=run.stopped,
        firmware={**(previous.firmware if previous else {}), **run.firmware},
        target=run.target,
        database=run.database_dir,
        untuned_latency_s=None if untuned_s is None else scheduled_s + untuned_s,
        scheduled_latency_s=fixed,
        runtimes=runtimes,
        parity=parity,
        time_to_parity=parity_text(runtimes, parity),
    )
    document = {"schema": SUMMARY_SCHEMA, "schema_version": SUMMARY_VERSION, **to_json(summary)}
    write_atomic(summary_path, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
    write_atomic(directory / "table.txt", (format_table(rows) + "\n").encode())
    title = f"{model} on {run.device_class}"
    plot_curve(directory / "curve.png", title, curve, knee_point, early, fastest_runtime(runtimes))
    return summary_path


def read_summary(path: Path) -> TuningSummary:
    """A `summary.json` as `write_model_report` writes it; a TuneError names the file and the
    field when it is damaged, of another schema version, or holds a value of the wrong kind."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TuneError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return load_versioned(
            TuningSummary,
            data,
            str(path),
            SUMMARY_SCHEMA,
            SUMMARY_VERSION,
            error=TuneError,
            unversioned_is_current=True,
        )
    except TuneError as err:
        raise TuneError(f"{err}; {_REBUILD}") from None


_REBUILD = "remove it: the next tuning run rebuilds it from the database (its tuning time and firmware restart)"


def format_table(rows: list[TaskRow]) -> str:
    def us(seconds: float | None) -> str:
        return f"{seconds * 1e6:.1f}" if seconds is not None else "-"

    return tabulate(
        [
            (
                r.name,
                f"{r.flops / 1e6:.2f}",
                r.calls,
                r.trials,
                r.failed_trials,
                us(r.best_latency_s),
                f"{r.gflops:.2f}" if r.gflops else "-",
            )
            for r in rows
        ],
        headers=("task", "MFLOP", "calls", "trials", "failed", "best (us)", "GFLOP/s"),
    )


def plot_curve(
    path: Path,
    title: str,
    curve: list[CurvePoint],
    knee_point: CurvePoint | None,
    early: list[EarlyPoint] = (),
    runtime: tuple[str, float] | None = None,
) -> None:
    curve_figure(title, curve, knee_point, early, runtime).savefig(path, dpi=100)


def curve_figure(
    title: str,
    curve: list[CurvePoint],
    knee_point: CurvePoint | None,
    early: list[EarlyPoint],
    runtime: tuple[str, float] | None = None,
):
    """The tuning curve: the early part (kernels not measured yet at their untuned or first
    measured latency) dashed, the whole-model estimate solid, the knee marked; with `runtime`
    (the faster runtime's name and time on the board), that time dotted across. A matplotlib
    `Figure` without pyplot (no global figure list, safe in a server's threads), imported here:
    the tuner's class processes import this module and draw once at the end, if at all."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    if early:
        xs = [p.trials for p in early] + ([curve[0].trials] if curve else [])
        ys = [p.latency_s * 1e3 for p in early] + ([curve[0].latency_s * 1e3] if curve else [])
        axes.plot(xs, ys, drawstyle="steps-post", linestyle="--", color="tab:gray", label=_early_label(early))
    if curve:
        axes.plot([p.trials for p in curve], [p.latency_s * 1e3 for p in curve], drawstyle="steps-post")
    if knee_point:
        axes.plot([knee_point.trials], [knee_point.latency_s * 1e3], "o", color="tab:red")
        axes.annotate(
            f"knee: {knee_point.trials} trials",
            (knee_point.trials, knee_point.latency_s * 1e3),
            textcoords="offset points",
            xytext=(8, 8),
        )
    if runtime:
        axes.axhline(runtime[1] * 1e3, linestyle=":", color="tab:green", label=f"{runtime[0]} on the board")
    axes.set_xlabel("trials spent on the model's kernels")
    axes.set_ylabel("estimated latency (ms)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if early or runtime:
        axes.legend(loc="lower left", fontsize="small")  # the curve falls from the upper left
    figure.tight_layout()
    return figure


def _early_label(early: list[EarlyPoint]) -> str:
    if all(p.untuned == p.stand_ins for p in early):
        return "kernels not measured yet at their untuned time"
    if any(p.untuned for p in early):
        return "kernels not measured yet at their untuned (or first measured) time"
    return "kernels not measured yet at their first measured time"


def progress_line(
    device_class: str,
    trials: int,
    budget: int | None,
    tasks_done: int,
    tasks: int,
    estimates: dict[str, float | None],
    boards_busy: int,
    boards: int,
    time_used: tuple[float, float] | None = None,
) -> str:
    """`[class] trials 48/128 this run  tasks 5/9  best est. mlp 0.052 ms  boards busy 1/2`:
    this run's trials against what it may measure (earlier runs' records are not in either);
    `budget` None: the run's time limit is its budget, and `time_used` (seconds used, limit)
    shows how much of it is gone: `trials 48 this run (95/1800 s)`."""
    best = "  ".join(f"{m} {v * 1e3:.3f} ms" if v is not None else f"{m} -" for m, v in estimates.items())
    spent = f"trials {trials}" + (f"/{budget}" if budget is not None else "") + " this run"
    if time_used is not None:
        spent += f" ({time_used[0]:.0f}/{time_used[1]:g} s)"
    return f"[{device_class}] {spent}  tasks {tasks_done}/{tasks}  best est. {best}  boards busy {boards_busy}/{boards}"
