"""Tune every selected device class: its models' deduplicated kernels, measured on the boards
of its tuning pool (`Fleet.pool_of`: every board of the class unless fleet.yaml names a pool).

Per class (in its own process, so classes tune concurrently and a crash stays in its class):
extract the tasks, plan the budget (resume: trials already in the database count), measure the
untuned time of each kernel not yet measured so (where the tuning curve starts) and each ONNX
model's time under the runtimes of a board not yet measured so (what time to parity is measured
against, `parity.py`), seed the search from a donor class where the inventory allows borrowing
and the tasks still without a trial from the profile's starter records (`starters.py`; seeded
trials count against their tasks' shares and train the cost model), then run
MetaSchedule's tuning loop under edgetune's budget scheduler (`scheduler.py`) with the
evolutionary search, the XGBoost cost model (reloaded from and saved to the class database
directory), the fast builder and the class's RPCRunner, each recorded round on the class's
tuning clock. Finally the reports are written from the database, and the run's trial rate is
logged for the next plan's time estimate.

A class that borrows from a class tuned in the same run starts when its donor has finished
(the donor's best schedules must exist to be borrowed); all other classes run at once.
With `compute: {ray: ...}` each class's run is a task on the Ray cluster instead of a process
here, and its candidates are built by Ray tasks (`edgetune.tune.on_ray`, docs/compute.md).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.target import build_target, missing_cross_compiler
from edgetune.compiler.tasks import ClassTasks, class_tasks
from edgetune.compiler.tir.rules import register_schedule_rules
from edgetune.errors import EdgetuneError, TuneError
from edgetune.fleet.on_board import read_firmware
from edgetune.fleet.parallel import for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.tracker import rpc_endpoint
from edgetune.inventory.schema import DeviceProfile, Fleet
from edgetune.inventory.workdir import Workdir
from edgetune.tune.borrow import EXACT, DonorTraces, Seeded, TraceSource, seed_tasks, snapshot_donor
from edgetune.tune.budget import AT_KNEE_BEFORE, UNBOUNDED_TRIALS, ParityBars, TaskLedger
from edgetune.tune.candidate_builder import make_builder
from edgetune.tune.class_process import class_process_pool
from edgetune.tune.database import (
    ClassDatabasePaths,
    append_run,
    clock_lines,
    locked_database,
    open_database,
    read_trials,
    snapshot,
    throughput,
    untuned_times,
)
from edgetune.tune.index_inputs import IndexBounds, class_index_bounds, index_notes
from edgetune.tune.monitor import (
    NO_BOARDS,
    BoardGuardRunner,
    RunMonitor,
    RunState,
    load_cost_model,
    save_cost_model,
)
from edgetune.tune.native_log import NATIVE_LOG, native_warnings_to
from edgetune.tune.parity import ClockRounds, TuningClock, measure_runtimes, parity_bars, recorded_runtimes
from edgetune.tune.plan import (
    ClassPlan,
    TaskPlan,
    TuningPlan,
    plan_class,
    plan_tuning,
    select_models,
)
from edgetune.tune.report import RunInfo, write_model_report
from edgetune.tune.runner import make_runner, wait_for_boards
from edgetune.tune.scheduler import BudgetScheduler
from edgetune.tune.search import UnmeasuredSearch
from edgetune.tune.shard import (
    SHARD_LOST,
    RecordStream,
    ShardOutcome,
    ShardPlacement,
    merge_states,
    placement,
    retrain_cost_model,
    seeded_database,
    shard_hashes,
    split_state,
)
from edgetune.tune.starters import StarterTraces, starters_dir
from edgetune.tune.stop import STOPPED, stop_requested, tuning
from edgetune.tune.untuned import measure_untuned
from edgetune.tvm_compat.record_lines import commit_lines

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSettings:
    """MetaSchedule's evolutionary search. Its host CPU per round grows with the population
    (TVM's default of 512 cost ~11 s per round here, 128 ~3 s), and a round measures only
    `trials_per_iter` of it: by default the population is sized to the round
    (`population_for`), POPULATION_PER_TRIAL candidates per trial within [MIN_POPULATION,
    MAX_POPULATION]. bench/trial_rate.py compares the sizes."""

    population_size: int | None = None  # None: sized to the round
    init_measured_ratio: float = 0.2
    genetic_num_iters: int = 3
    # host threads per class for the search and the cost model; None: the host's cores, shared
    # among the classes tuning at once (`for_classes`), or a Ray task's CPUs
    num_threads: int | None = None
    seed: int = 0

    def population_for(self, trials_per_iter: int) -> int:
        if self.population_size is not None:
            return self.population_size
        return min(max(POPULATION_PER_TRIAL * trials_per_iter, MIN_POPULATION), MAX_POPULATION)

    def threads(self) -> int:
        """The search's threads: `num_threads`, or every core this process may run on."""
        return self.num_threads or host_cores()

    def for_classes(self, classes: int, cpus: int) -> SearchSettings:
        """These settings for one of `classes` classes sharing `cpus` CPUs (an explicit
        `num_threads` stays)."""
        return self if self.num_threads else replace(self, num_threads=max(1, cpus // classes))


def host_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


POPULATION_PER_TRIAL = 4
MIN_POPULATION = 32  # below this the genetic search has too little to cross over
MAX_POPULATION = 128


@dataclass(frozen=True)
class TuneOptions:
    classes: tuple[str, ...] | None = None  # None: every class
    models: tuple[str, ...] | None = None  # None: every model
    borrow: bool = True  # honour tuning.borrow of the inventory
    starters: bool = True  # seed the tasks still without a trial from the profile's starter records
    # the starter records to use; None: the profile's (`starters.starters_dir`), where it has them
    starters_dir: Path | None = None
    search: SearchSettings = field(default_factory=SearchSettings)
    # BoardGuardRunner's `exclusive`; None: when a board of the class is simulated (it shares
    # the host's CPUs with the search and the builds)
    measure_exclusively: bool | None = None


@dataclass(frozen=True)
class ClassResult:
    device_class: str
    budget: int
    done_before: int  # trials already in the database for these models
    trials_run: int  # trials spent by this run (borrowed ones included)
    borrowed_trials: int
    tuning_time_s: float
    summaries: tuple[str, ...]  # reports/<class>/<model>/summary.json
    stopped: str | None = None  # why the run stopped before spending its budget
    error: str | None = None  # the class could not tune (others went on)
    search_time_s: float = 0.0  # from the first round to the last measured (what time_limit_s bounds)
    shards: tuple[ShardPlacement, ...] = ()  # where each shard of a split search ran (compute.ray.shards_per_class)
    # from a round's hand-over to its recording, the longest of the run (a time limit is overrun
    # by less); None where no round was searched on this host (none run, or all in shards)
    longest_round_s: float | None = None
    starter_trials: int = 0  # trials this run spent measuring starter records (in trials_run)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class TuneResult:
    plan: TuningPlan
    classes: tuple[ClassResult, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.classes)

    @property
    def trials_run(self) -> int:
        return sum(c.trials_run for c in self.classes)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "trials_run": self.trials_run,
            "classes": [{**asdict(c), "ok": c.ok} for c in self.classes],
        }


def tune_fleet(fleet: Fleet, options: TuneOptions = TuneOptions()) -> TuneResult:
    """Tune the selected classes (concurrently, one process each) and return per-class results."""
    plan = plan_tuning(fleet, options.classes, options.models)
    for warning in plan.warnings:
        log.warning("warning: %s", warning)
    names = [c.device_class for c in plan.classes]
    if fleet.compute is not None:  # an unreachable cluster, or a node that cannot measure, stops here
        from edgetune.tune.on_ray.cluster import join

        join(fleet, names)
    results: dict[str, ClassResult] = {}
    with tuning():
        for stage in _stages(fleet, names, options.borrow):
            if stop_requested():  # a class that borrows from a stopped one does not start
                results.update({name: ClassResult(name, 0, 0, 0, 0, 0.0, (), stopped=STOPPED) for name in stage})
                continue
            results.update(_run_stage(fleet, stage, options))
    return TuneResult(plan, tuple(results[n] for n in names))


def _run_stage(fleet: Fleet, stage: list[str], options: TuneOptions) -> dict[str, ClassResult]:
    """Tune the classes of a stage at once: each in a process of its own on this host, or as a
    task on the Ray cluster of `compute` (edgetune.tune.on_ray)."""
    if fleet.compute is not None:
        from edgetune.tune.on_ray.cluster import run_classes

        options = replace(options, search=options.search.for_classes(1, int(fleet.compute.cpus_per_class)))
        outcomes = run_classes(fleet, {name: (fleet, name, options) for name in stage}, tune_class_on_node)
    else:
        options = replace(options, search=options.search.for_classes(len(stage), host_cores()))
        with class_process_pool(len(stage)) as pool:
            futures = {name: pool.submit(tune_class, fleet, name, options) for name in stage}
            outcomes = {name: _outcome(future) for name, future in futures.items()}
    return {
        name: outcome
        if isinstance(outcome, ClassResult)  # else the class process or task died (e.g. a TVM crash)
        else ClassResult(name, 0, 0, 0, 0, 0.0, (), error=f"{name}: {outcome}")
        for name, outcome in outcomes.items()
    }


def _outcome(future) -> ClassResult | Exception:
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 -- the class process died
        return err


def tune_class_on_node(fleet: Fleet, device_class: str, options: TuneOptions) -> ClassResult:
    """`tune_class` in a Ray worker process, whose logging nobody set up: progress lines to stderr."""
    _console_progress()
    return tune_class(fleet, device_class, options)


def tune_class(fleet: Fleet, device_class: str, options: TuneOptions) -> ClassResult:
    """Tune one class to its budget; a TuneError becomes the result's `error`. TVM's and
    onnxruntime's warnings go to the class's logs/native.log, not the console."""
    _log_to_stderr()
    started = time.monotonic()
    try:
        with native_warnings_to(ClassDatabasePaths.of(fleet.workdir, device_class).logs / NATIVE_LOG):
            return _tune_class(fleet, device_class, options, started)
    except EdgetuneError as err:
        log.error("error: %s", err)
        return ClassResult(device_class, 0, 0, 0, 0, time.monotonic() - started, (), error=str(err))


def _tune_class(fleet: Fleet, device_class: str, options: TuneOptions, started: float) -> ClassResult:
    profile = fleet.device_class(device_class).profile
    target = build_target(profile)
    unlinkable = missing_cross_compiler(profile)
    if unlinkable:
        raise TuneError(f"class {device_class}: {unlinkable}")
    starters = _starters(profile, options)
    models = select_models(fleet, options.models)
    paths = ClassDatabasePaths.of(fleet.workdir, device_class)
    tasks = class_tasks(models, target)
    plan = plan_class(fleet, device_class, models, tasks.tasks, read_trials(paths), throughput(paths))
    spent = borrowed = from_starters = 0
    starter_trials: dict[str, int] = {}  # per workload hash
    searched_s, longest_round_s = 0.0, None
    stopped = None
    shards: tuple[ShardPlacement, ...] = ()
    ledgers: list[TaskLedger] = []
    if plan.remaining > 0:
        endpoint = rpc_endpoint(fleet, device_class)
        if wait_for_boards(endpoint) == 0:
            raise TuneError(
                f"class {device_class}: no board is registered with the tracker "
                f"{endpoint.address} under key {device_class!r}; "
                f"start the boards (`edgetune fleet up`) and re-run `edgetune tune --class {device_class}`"
            )
        with (
            tempfile.TemporaryDirectory(prefix=f"edgetune-{device_class}-") as scratch,
            locked_database(paths) as database,  # one process tunes or repairs a class at a time
            closing(_candidate_builder(fleet, scratch, profile.cross_compiler)) as builder,
        ):
            measuring = time.monotonic()
            boards = len(fleet.pool_of(device_class))
            exclusive = measures_exclusively(fleet, device_class, options)
            if exclusive:
                log.info(
                    "[%s] measuring exclusively: nothing is searched or built while a board measures", device_class
                )
            log.info(
                "[%s] searching on %d host threads, a population of %d for rounds of %d",
                device_class,
                options.search.threads(),
                options.search.population_for(plan.trials_per_iter),
                plan.trials_per_iter,
            )
            bounds = _index_bounds(device_class, tasks)
            runner = BoardGuardRunner(
                endpoint, boards, make_runner(endpoint, boards, profile.measurement, bounds), exclusive
            )
            selected = _searched_tasks(plan)
            contexts = _tune_contexts(selected, tasks, target, paths.logs, options.search, plan.trials_per_iter)
            cost_model = _cost_model(paths, options.search)
            measure_untuned(
                device_class,
                {h: tasks.extracted[h] for h in [*(t.workload_hash for t in selected), *tasks.scheduled_hashes]},
                target,
                builder,
                runner,
                paths,
            )
            measure_runtimes(fleet, device_class, models, paths)
            clock = TuningClock(paths, measuring)
            clock.start()
            donor = plan.borrow_from if options.borrow else None
            seeding = _Seeding(plan, contexts, database, target, builder, runner, cost_model)
            lent = _borrow(fleet, donor, scratch, seeding) if donor else {}
            kept = _seed_from_starters(starters, frozenset(lent), seeding) if starters else {}
            clock.recount()
            borrowed = sum(s.trials for s in lent.values())
            starter_trials = {h: s.trials for h, s in kept.items()}
            from_starters = sum(starter_trials.values())
            seeded = {h: s.trials for h, s in (lent | kept).items()}
            state = _run_state(fleet, plan, tasks, selected, seeded, read_trials(paths))
            if _shards(fleet, selected) > 1:
                spent, stopped, shards = _search_in_shards(
                    fleet, options, plan, selected, contexts, database, cost_model, paths, state, clock
                )
            else:
                parity = _parity_bars(fleet, device_class, models, tasks, paths)
                spent, stopped = _search(
                    plan, selected, contexts, database, builder, runner, cost_model, paths, state, parity, clock
                )
            searched_s, longest_round_s = state.searched_s(), state.longest_round_s
            ledgers = state.ledgers
            if spent + borrowed + from_starters:
                append_run(paths, spent + borrowed + from_starters, time.monotonic() - measuring, boards)
    trials_run = spent + borrowed + from_starters
    summaries = _write_reports(
        fleet,
        device_class,
        plan,
        tasks,
        paths,
        trials_run,
        time.monotonic() - started,
        stopped,
        plan.borrow_from if borrowed else None,
        _task_stops(plan, ledgers),
        starter_trials,
    )
    return ClassResult(
        device_class,
        plan.budget,
        plan.done,
        trials_run,
        borrowed,
        time.monotonic() - started,
        summaries,
        stopped=stopped,
        error=f"class {device_class}: {stopped}" if stopped in (NO_BOARDS, SHARD_LOST) else None,
        search_time_s=searched_s,
        shards=shards,
        longest_round_s=longest_round_s,
        starter_trials=from_starters,
    )


def _candidate_builder(fleet: Fleet, scratch: str, cross_compiler: str | None) -> ms.builder.Builder:
    """Builds on this host (two build processes, kept for the process's later runs), or Ray tasks
    on the cluster of `compute`. Closed at the end of the run."""
    if fleet.compute is None:
        return make_builder(scratch, cross_compiler, max_workers=2)
    from edgetune.tune.on_ray.builder import RayBuilder
    from edgetune.tune.on_ray.cluster import connect_cluster

    connect_cluster(fleet.compute)
    return RayBuilder(scratch, cross_compiler, fleet.compute)


def measures_exclusively(fleet: Fleet, device_class: str, options: TuneOptions) -> bool:
    """Whether the class's pool boards measure alone (`BoardGuardRunner`'s `exclusive`): as
    asked, else when one of them is simulated on this host (timed while the host builds, it
    would measure the builds)."""
    if options.measure_exclusively is not None:
        return options.measure_exclusively
    return any(board.shares_host_cpus for board in fleet.pool_of(device_class))


def _index_bounds(device_class: str, tasks: ClassTasks) -> dict[str, IndexBounds]:
    """The bounds of the inputs the class's kernels index with (`index_inputs`), each logged."""
    funcs = [(task.task_name, task.dispatched[0]["main"]) for task in tasks.extracted.values()]
    for name, func in funcs:
        for note in index_notes(func):
            log.info("[%s] %s: %s", device_class, name, note)
    return class_index_bounds(func for _, func in funcs)


def _searched_tasks(plan: ClassPlan) -> list[TaskPlan]:
    """The tasks with planned trials, and where trials go by expected gain (those tasks at
    their knee freed, or a time budget's), every task that may still gain (it may be given them)."""
    by_gain = plan.freed or plan.time_is_the_budget
    return [t for t in plan.tasks if t.planned > 0 or (by_gain and not t.at_knee)]


def _tune_contexts(
    selected: list[TaskPlan],
    tasks: ClassTasks,
    target: tvm.target.Target,
    logs: Path,
    search: SearchSettings,
    trials_per_iter: int,
) -> list[ms.TuneContext]:
    """MetaSchedule's default CPU rules; a kernel that `prepare` marked with `schedule_rule`
    gets edgetune's rule of that name (`register_schedule_rules`). The
    evolutionary search skips schedules the database measured before (`UnmeasuredSearch`).
    MetaSchedule's per-task logs go to `logs`."""
    load_cpu_intrinsics(target)
    register_schedule_rules()
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [tasks.extracted[t.workload_hash] for t in selected],
        work_dir=str(logs),
        strategy=UnmeasuredSearch(
            ms.search_strategy.EvolutionarySearch(
                population_size=search.population_for(trials_per_iter),
                init_measured_ratio=search.init_measured_ratio,
                genetic_num_iters=search.genetic_num_iters,
            )
        ),
        num_threads=search.threads(),
        seed=search.seed,
    )
    return contexts


def _cost_model(paths: ClassDatabasePaths, search: SearchSettings) -> ms.cost_model.XGBModel:
    """The class's XGBoost cost model, as the last run left it."""
    cost_model = ms.cost_model.XGBModel(num_tuning_cores=search.threads())
    if paths.cost_model.exists():
        load_cost_model(cost_model, paths.cost_model)
    return cost_model


@dataclass(frozen=True)
class _Seeding:
    """What seeding a class run's tasks from a source of traces needs (`borrow.seed_tasks`)."""

    plan: ClassPlan
    contexts: list[ms.TuneContext]  # of the searched tasks, in order
    database: ms.database.Database
    target: tvm.target.Target
    builder: ms.builder.Builder
    runner: ms.runner.Runner
    cost_model: ms.cost_model.CostModel

    def seed(self, source: TraceSource, skip: frozenset[str] = frozenset()) -> dict[str, Seeded]:
        """Half a round of the source's schedules for each searched task with planned trials and
        none measured yet, but those of `skip`."""
        fresh = {
            t.workload_hash: c
            for t, c in zip(_searched_tasks(self.plan), self.contexts)
            if t.done == 0 and t.planned > 0 and t.workload_hash not in skip
        }
        per_task = max(self.plan.trials_per_iter // 2, 1)
        return seed_tasks(
            source, self.database, fresh, self.target, self.builder, self.runner, per_task, self.cost_model
        )


def _borrow(fleet: Fleet, donor: str, scratch: str, seeding: _Seeding) -> dict[str, Seeded]:
    """Seed the never-measured tasks with the donor's best schedules; return what each took."""
    device_class = seeding.plan.device_class
    donor_db = snapshot_donor(ClassDatabasePaths.of(fleet.workdir, donor), Path(scratch) / "donor")
    if donor_db is None:
        log.info("[%s] borrowing: %s has no tuning records yet", device_class, donor)
        return {}
    seeded = seeding.seed(DonorTraces(donor_db))
    trials = sum(s.trials for s in seeded.values())
    log.info("[%s] borrowed %d schedules from %s (re-measured here)", device_class, trials, donor)
    return seeded


def _starters(profile: DeviceProfile, options: TuneOptions) -> Path | None:
    """The starter records the run uses: `options.starters_dir` (which must exist), else the
    profile's where it has them; None with `starters=False`."""
    if not options.starters:
        return None
    if options.starters_dir is None:
        default = starters_dir(profile)
        return default if default.is_dir() else None
    if not Path(options.starters_dir).is_dir():
        raise TuneError(f"starter records {options.starters_dir}: no such directory")
    return Path(options.starters_dir)


def _seed_from_starters(directory: Path, borrowed: frozenset[str], seeding: _Seeding) -> dict[str, Seeded]:
    """Seed the never-measured tasks that borrowing left without a trial from the starter
    records of `directory`; log how, and return what each took."""
    seeded = seeding.seed(StarterTraces.open(directory), borrowed)
    exact = sum(s.how == EXACT for s in seeded.values())
    log.info(
        "[%s] starter records (%s): %d tasks seeded exactly, %d by transfer, %d trials (re-measured here)",
        seeding.plan.device_class,
        directory,
        exact,
        len(seeded) - exact,
        sum(s.trials for s in seeded.values()),
    )
    return seeded


def _share_after_seeding(task: TaskPlan, seeded: int, time_is_the_budget: bool) -> int:
    if seeded and time_is_the_budget:
        return 0
    return max(task.planned - seeded, 0)


def _run_state(
    fleet: Fleet, plan: ClassPlan, tasks: ClassTasks, selected: list[TaskPlan], seeded: Mapping[str, int], trials: list
) -> RunState:
    """Each searched task's account: its planned share less what seeding (borrowing, starter
    records) spent on it, and its ceiling (`max_trials_per_task`, seeded trials included). A
    seeded task has had its first round (the tasks without one go first); in a run budgeted by
    its time, whose plan is a round per task, that is all of its share, so its next round is a
    whole one given by expected gain, not the half round its plan had left. A run budgeted by its
    time has no trial bound: its time limit ends it."""
    policy = fleet.tuning
    run_budget = (UNBOUNDED_TRIALS if plan.time_is_the_budget else plan.remaining) - sum(seeded.values())
    history = {t.workload_hash: [r.latency_s for r in trials if r.workload_hash == t.workload_hash] for t in selected}
    ledgers = [
        TaskLedger(
            workload_hash=t.workload_hash,
            weight=t.weight,
            share=_share_after_seeding(t, seeded.get(t.workload_hash, 0), plan.time_is_the_budget),
            ceiling=(
                policy.max_trials_per_task - len(history[t.workload_hash]) if policy.max_trials_per_task else run_budget
            ),
            history=history[t.workload_hash],
            rounds=1 if seeded.get(t.workload_hash) else 0,
        )
        for t in selected
    ]
    return RunState(
        device_class=plan.device_class,
        task_calls={m: {t.workload_hash: t.calls_in(m) for t in tasks.tasks if t.calls_in(m)} for m in plan.models},
        ledgers=ledgers,
        names=[t.name for t in selected],
        run_budget=run_budget,
        trials_per_iter=plan.trials_per_iter,
        early_stop=policy.early_stop,
        time_limit_s=policy.time_limit_s,
        time_is_the_budget=plan.time_is_the_budget,
        best=_seeded_best(history, seeded),
    )


def _seeded_best(history: Mapping[str, list[float | None]], seeded: Mapping[str, int]) -> dict[str, float]:
    """The best latency this run of each seeded task: its seeds are the last of its history."""
    best = {}
    for workload_hash, count in seeded.items():
        valid = [s for s in history.get(workload_hash, [])[-count:] if s is not None] if count else []
        if valid:
            best[workload_hash] = min(valid)
    return best


def _search(
    plan: ClassPlan,
    selected: list[TaskPlan],
    contexts,
    database,
    builder,
    runner,
    cost_model,
    paths: ClassDatabasePaths,
    state: RunState,
    parity: ParityBars,
    clock: TuningClock,
) -> tuple[int, str | None]:
    """Run MetaSchedule's tuning loop under the budget scheduler, each recorded round on the
    class's clock; return (trials, stop reason)."""
    if state.run_budget <= 0 or not selected:
        return 0, None
    _tune_loop(
        selected,
        contexts,
        database,
        builder,
        runner,
        cost_model,
        paths.cost_model,
        paths.directory,
        state,
        parity,
        ClockRounds(clock),
    )
    if state.stopped:
        log.info("[%s] stopped: %s", plan.device_class, state.stopped)
    return state.spent, state.stopped


def _tune_loop(
    selected: list[TaskPlan],
    contexts,
    database,
    builder,
    runner,
    cost_model,
    cost_model_path: Path,
    work_dir: Path,
    state: RunState,
    parity: ParityBars,
    *callbacks: ms.measure_callback.MeasureCallback,
) -> None:
    """MetaSchedule's tuning loop over `contexts` under the budget scheduler of `state` (the
    models still slower than their faster runtime first: `parity`); the cost model saved to
    `cost_model_path` after every round and at the end."""
    ms.tune.tune_tasks(
        tasks=contexts,
        task_weights=[t.weight for t in selected],
        work_dir=str(work_dir),
        max_trials_global=state.run_budget,
        max_trials_per_task=max(max(ledger.ceiling, ledger.share) for ledger in state.ledgers),
        num_trials_per_iter=state.trials_per_iter,
        builder=builder,
        runner=runner,
        database=database,
        cost_model=cost_model,
        measure_callbacks=[
            *ms.measure_callback.MeasureCallback.create("default"),
            RunMonitor(state, runner, cost_model, cost_model_path),
            *callbacks,
        ],
        task_scheduler=BudgetScheduler(state, parity),
    )
    save_cost_model(cost_model, cost_model_path)


def _shards(fleet: Fleet, selected: list[TaskPlan]) -> int:
    """How many shards the class run's search is split into: `compute.ray.shards_per_class`,
    at most one per searched task; 1 (no split) on this host alone."""
    return 1 if fleet.compute is None else min(fleet.compute.shards_per_class, len(selected))


def _search_in_shards(
    fleet: Fleet,
    options: TuneOptions,
    plan: ClassPlan,
    selected: list[TaskPlan],
    contexts,
    database,
    cost_model,
    paths: ClassDatabasePaths,
    state: RunState,
    clock: TuningClock,
) -> tuple[int, str | None, tuple[ShardPlacement, ...]]:
    """The search split into shards on the Ray cluster (edgetune.tune.shard), their records
    committed to the class database as they come (and on the class's clock); then the cost
    model retrained on them all. Returns (trials, stop reason, where each shard ran)."""
    from edgetune.tune.on_ray.shards import run_shards

    if state.run_budget <= 0:
        return 0, None, ()
    by_hash = {t.workload_hash: t for t in selected}
    states = split_state(state, _shards(fleet, selected))
    log.info(
        "[%s] searching in %d shards on the Ray cluster: %s",
        plan.device_class,
        len(states),
        "; ".join(f"{len(s.ledgers)} tasks" for s in states),
    )
    outcomes = run_shards(
        fleet,
        plan.device_class,
        [(fleet, plan, options, [by_hash[h] for h in shard_hashes(s)], s) for s in states],
        search_shard,
        lambda records: _commit_on_clock(database, records, clock),
    )
    problems = merge_states(state, outcomes)
    started = time.monotonic()
    trained = retrain_cost_model(cost_model, contexts, database)
    save_cost_model(cost_model, paths.cost_model)
    log.info(
        "[%s] cost model retrained on the %d records of every searched task in %.1f s",
        plan.device_class,
        trained,
        time.monotonic() - started,
    )
    state.stopped = next((p for p in problems if p in (SHARD_LOST, NO_BOARDS)), problems[0] if problems else None)
    if state.stopped:
        log.info("[%s] stopped: %s", plan.device_class, state.stopped)
    return state.spent, state.stopped, tuple(placement(s, o) for s, o in zip(states, outcomes))


def _commit_on_clock(database, records: list, clock: TuningClock) -> None:
    commit_lines(database, records)
    clock.advance(len(records))


def search_shard(
    fleet: Fleet, plan: ClassPlan, options: TuneOptions, selected: list[TaskPlan], state: RunState, send
) -> ShardOutcome:
    """One shard of a class run's search (run by edgetune.tune.on_ray.shards on a node): its
    tasks searched with its own contexts, a copy of the class's cost model and the class's
    records of its tasks; `send` takes every measured record to the class run."""
    _console_progress()
    quiet_meta_schedule_logger()
    device_class = plan.device_class
    profile = fleet.device_class(device_class).profile
    target = build_target(profile)
    models = select_models(fleet, options.models)
    tasks = class_tasks(models, target)
    paths = ClassDatabasePaths.of(fleet.workdir, device_class)
    endpoint = rpc_endpoint(fleet, device_class)
    boards = len(fleet.pool_of(device_class))
    with (
        tempfile.TemporaryDirectory(prefix=f"edgetune-{device_class}-shard-") as scratch,
        closing(_candidate_builder(fleet, scratch, profile.cross_compiler)) as builder,
    ):
        work = Path(scratch)
        runner = BoardGuardRunner(
            endpoint,
            boards,
            make_runner(endpoint, boards, profile.measurement, _index_bounds(device_class, tasks)),
            measures_exclusively(fleet, device_class, options),
        )
        contexts = _tune_contexts(selected, tasks, target, work / "logs", options.search, plan.trials_per_iter)
        database = seeded_database(open_database(snapshot(paths, work / "database")), contexts)
        cost_model = _cost_model(paths, options.search)
        _tune_loop(
            selected,
            contexts,
            database,
            builder,
            runner,
            cost_model,
            work / "cost_model.tar",
            work,
            state,
            _parity_bars(fleet, device_class, models, tasks, paths),
            RecordStream(send, work / "sent"),
        )
    return ShardOutcome(tuple(state.ledgers), state.stopped)


def _parity_bars(fleet: Fleet, device_class: str, models, tasks: ClassTasks, paths: ClassDatabasePaths) -> ParityBars:
    """The models of the run with runtime times, for the scheduler to tell those still slower."""
    runtimes = recorded_runtimes(fleet, device_class, models, paths)
    return parity_bars(tasks.tasks, runtimes, read_trials(paths), untuned_times(paths), tasks.scheduled)


def _task_stops(plan: ClassPlan, ledgers: list[TaskLedger]) -> dict[str, str]:
    """Why each stopped task got no more trials: at its knee before the run, or stopped during it."""
    stops = {t.workload_hash: AT_KNEE_BEFORE for t in plan.tasks if t.at_knee}
    return stops | {ledger.workload_hash: ledger.stopped for ledger in ledgers if ledger.stopped}


def _write_reports(
    fleet, device_class, plan, tasks, paths, trials_run, elapsed, stopped, borrowed_from, task_stops, starter_trials
):
    trials = read_trials(paths)
    run = RunInfo(
        device_class=device_class,
        target=dict(plan.target),
        database_dir=str(paths.directory),
        borrowed_from=borrowed_from,
        starter_trials=starter_trials,
        trials_this_run=trials_run,
        tuning_time_s=elapsed,
        stopped=stopped,
        firmware=_firmware(fleet, device_class) if trials_run else {},
        task_stops=task_stops,
    )
    directory = Workdir(fleet.workdir).reports(device_class)
    untuned = untuned_times(paths)
    runtimes = recorded_runtimes(fleet, device_class, select_models(fleet, plan.models), paths)
    clock = clock_lines(paths)
    return tuple(
        str(
            write_model_report(
                directory / m, m, tasks.tasks, trials, run, untuned, runtimes.get(m, {}), clock, tasks.scheduled
            )
        )
        for m in plan.models
    )


def _firmware(fleet: Fleet, device_class: str) -> dict[str, str]:
    """The firmware fingerprint of each reachable board of the class's tuning pool (the others are left out)."""

    def read(board):
        with BoardSession(board) as session:
            return read_firmware(session, fleet)

    return dict(for_each_board(fleet.pool_of(device_class), read).succeeded)


def _log_to_stderr() -> None:
    """A class process starts without logging set up: show edgetune's progress lines. Run in
    the calling process (a regression re-tune, a test), the caller's logging set-up stands."""
    if multiprocessing.parent_process() is not None:
        _console_progress()
    quiet_meta_schedule_logger()


def _console_progress() -> None:
    """edgetune's progress lines to stderr, in a process where nothing set up logging."""
    root = logging.getLogger("edgetune")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False  # TVM configures the root logger too: print once


def quiet_meta_schedule_logger() -> None:
    """Call before making MetaSchedule's tune contexts in a process whose logging others set up.
    MetaSchedule sets its console handler to its logger's level and logs everything to the
    class's logs/ directory regardless: keep its per-batch tables off the console. Its logging
    set-up lists this logger's handlers by name and crashes on one without a name (pytest's
    capture handlers, for one): it owns this logger, so it keeps only its own."""
    meta_schedule = logging.getLogger("tvm.s_tir.meta_schedule")
    meta_schedule.setLevel(logging.WARNING)
    for handler in [h for h in meta_schedule.handlers if h.get_name() is None]:
        meta_schedule.removeHandler(handler)


def _stages(fleet: Fleet, names: list[str], borrow: bool) -> list[list[str]]:
    """Each class that borrows from a class tuned in this run goes in a stage after it (chains too)."""
    return fleet.tuning.borrow_stages(names) if borrow else [names]
