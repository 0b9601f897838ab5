"""The budget rule for real: MetaSchedule's tuning loop under edgetune's budget scheduler on a
loopback board of the test's own, plus the rule's pure parts (knee, next task) on given numbers.

One class (`classa`, one board), three runs on one database:
1. mlp alone, 2 rounds per task, no early stop;
2. mlp and a small ONNX conv net, a class-wide budget dealt a round at a time, with an early
   stop so strict (`min_gain` 0.99 over the last 4 trials) that a task with more than 4 trials
   has always reached it: the mlp tasks are at their knee before the run, their share goes to
   the conv net's tasks, which stop in turn once they pass 4 trials;
3. a time limit as the only budget: a round per task before any second, the run ends within a
   round of the limit with its report written; the plan of the next run counts what it measured.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import tvm
from support.fleet_marker import starts_fleet
from support.fleets import V3, make_fleet, mlp
from support.loopback_boards import Loopback
from support.onnx_samples import conv_model
from tvm import te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from edgetune.compiler.intrinsics import load_cpu_intrinsics
from edgetune.compiler.target import build_target
from edgetune.compiler.tasks import class_tasks
from edgetune.inventory.schema import EarlyStop
from edgetune.tune.budget import (
    AT_KNEE_BEFORE,
    SEARCH_SPACE_END,
    TaskLedger,
    choose_task,
    reached_knee,
    stop_at_knee,
)
from edgetune.tune.candidate_builder import make_builder
from edgetune.tune.database import (
    ClassDatabasePaths,
    open_database,
    read_trials,
    throughput,
)
from edgetune.tune.monitor import RunState
from edgetune.tune.plan import plan_class
from edgetune.tune.scheduler import BudgetScheduler
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_fleet

PER_ITER = 4
STRICT = EarlyStop(window=4, min_gain=0.99)
TIME_LIMIT_S = 10.0
QUICK = TuneOptions(search=SearchSettings(population_size=32, genetic_num_iters=1))  # less host CPU per round


def _policy(fleet, **changes):
    return fleet.replace(tuning=replace(fleet.tuning, **changes))


@pytest.fixture(scope="module")
@starts_fleet
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("budget")
    loopback = Loopback(workdir)
    try:
        loopback.start_board("a1", "classa")
        loopback.wait_registered(1)
        base = make_fleet(workdir, loopback.port, {"classa": V3}, {"classa": 1}, (mlp(),), 0, PER_ITER, None)
        paths = ClassDatabasePaths.of(workdir, "classa")
        first = tune_fleet(_policy(base, trials_per_class=None, trials_per_task=2 * PER_ITER, early_stop=None), QUICK)
        after_first = len(read_trials(paths))
        both = base.replace(models=(mlp(), conv_model(workdir / "conv.onnx")))
        tasks = class_tasks(both.models, build_target(both.device_class("classa").profile)).tasks
        conv_tasks = [t for t in tasks if t.calls_in("mlp") == 0]
        # a round per conv task, one more per mlp task, and a round to spare: the conv tasks that
        # take the mlp's share stop at their knees, not at the budget's end
        to_run = len(conv_tasks) * PER_ITER + 2 * PER_ITER + PER_ITER
        second_fleet = _policy(
            both, trials_per_class=after_first + to_run, max_trials_per_task=3 * PER_ITER, early_stop=STRICT
        )
        second_plan = plan_class(second_fleet, "classa", both.models, tasks, read_trials(paths))
        second = tune_fleet(second_fleet, QUICK)
        after_second = len(read_trials(paths))
        second_rows = {
            row["workload_hash"]: row
            for path in second.classes[0].summaries  # the third run rewrites them
            for row in json.loads(Path(path).read_text())["tasks"]
        }
        limited = _policy(
            both,
            trials_per_class=None,
            trials_per_task=None,
            max_trials_per_task=None,
            early_stop=None,
            time_limit_s=TIME_LIMIT_S,
        )
        third = tune_fleet(limited, QUICK)
        yield {
            "paths": paths,
            "first": first,
            "after_first": after_first,
            "conv_tasks": conv_tasks,
            "second_plan": second_plan,
            "second": second,
            "after_second": after_second,
            "second_rows": second_rows,
            "third": third,
            "fleet": limited,
            "to_run": to_run,
            "tasks": tasks,
        }
    finally:
        loopback.close()


def _batches(trials) -> list[tuple[str, int]]:
    """(workload hash, trials) of each run of consecutive records of one task."""
    batches: list[list] = []
    for trial in trials:
        if batches and batches[-1][0] == trial.workload_hash:
            batches[-1][1] += 1
        else:
            batches.append([trial.workload_hash, 1])
    return [tuple(b) for b in batches]


def test_every_task_is_measured_before_any_gets_a_second_round(runs):
    first, second = runs["first"], runs["second"]
    assert first.ok and second.ok, [c.error for c in (*first.classes, *second.classes)]
    trials = read_trials(runs["paths"])
    for records in (trials[: runs["after_first"]], trials[runs["after_first"] : runs["after_second"]]):
        order = [h for h, _ in _batches(records)]
        tasks = set(order)
        assert len(tasks) >= 2
        assert len(set(order[: len(tasks)])) == len(tasks), order  # the first rounds cover every task


def test_a_task_at_its_knee_gets_nothing_and_its_share_goes_to_tasks_still_gaining(runs):
    plan, second = runs["second_plan"], runs["second"].classes[0]
    mlp_tasks = [t for t in plan.tasks if "mlp" in t.models]
    assert all(t.at_knee and t.done == 2 * PER_ITER for t in mlp_tasks)
    assert plan.freed == 2 * PER_ITER and plan.remaining == runs["to_run"]
    run = read_trials(runs["paths"])[runs["after_first"] : runs["after_second"]]
    assert second.trials_run == len(run) <= runs["to_run"]
    assert not {t.workload_hash for t in run} & {t.workload_hash for t in mlp_tasks}  # no trial on the mlp:
    per_task = [sum(r.workload_hash == t.workload_hash for r in run) for t in runs["conv_tasks"]]
    # its trials went to conv tasks beyond their own round (a task whose search space ran out
    # after fewer candidates left its rest too), each stopped once it passed the 4-trial window
    assert sum(n - PER_ITER for n in per_task if n > PER_ITER) == 2 * PER_ITER
    assert max(per_task) <= 2 * PER_ITER
    rows = runs["second_rows"]
    assert all(rows[t.workload_hash]["stopped"] == AT_KNEE_BEFORE for t in mlp_tasks)  # the report says why
    assert all(
        (rows[t.workload_hash]["stopped"] or "").startswith("knee: best improved less than 99%")
        for t, n in zip(runs["conv_tasks"], per_task)
        if n > PER_ITER
    ), [(t.name, n, rows[t.workload_hash]["stopped"]) for t, n in zip(runs["conv_tasks"], per_task)]
    assert second.stopped == "every task reached its knee, its cap or the end of its search space"


def test_a_time_budget_ends_the_run_within_a_round_of_its_limit_with_its_report(runs):
    third = runs["third"].classes[0]
    assert third.ok, third.error
    assert third.stopped == f"time limit of {TIME_LIMIT_S:g} s reached: a further round would end past it"
    summary = json.loads(Path(third.summaries[0]).read_text())
    assert summary["stopped"] == third.stopped and summary["trials"] > 0
    run = read_trials(runs["paths"])[runs["after_second"] :]
    assert len(run) == third.trials_run > 0  # every trial measured was recorded
    # not before the last two rounds' worth of the limit, and past it by less than its longest
    # round (the mean decides; a round slowed by the host's other work overruns by its excess)
    mean_round = third.search_time_s / len(_batches(run))
    assert third.longest_round_s is not None
    assert TIME_LIMIT_S - 2 * mean_round <= third.search_time_s <= TIME_LIMIT_S + third.longest_round_s, (
        third.search_time_s,
        mean_round,
        third.longest_round_s,
    )


def test_a_time_budget_measures_every_task_before_any_second_round(runs):
    order = [h for h, _ in _batches(read_trials(runs["paths"])[runs["after_second"] :])]
    stops = {
        row["workload_hash"]: row["stopped"]
        for path in runs["third"].classes[0].summaries
        for row in json.loads(Path(path).read_text())["tasks"]
    }
    # a task whose search found no schedule the database lacks had its round, empty: no batch
    ended = {h for h, why in stops.items() if why == SEARCH_SPACE_END and h not in order}
    rounds = [t.workload_hash for t in runs["tasks"] if t.workload_hash not in ended]
    first = order[: len(rounds)]
    assert len(set(first)) == len(first), (order, stops)  # no task twice among the first rounds
    if len(order) > len(rounds):  # a second round went only after every task had one
        assert set(first) == set(rounds), (order, stops)


def test_the_next_plan_resumes_from_what_the_timed_run_measured(runs):
    records = read_trials(runs["paths"])
    assert len(open_database(runs["paths"])) == len(records)  # TVM loads every record
    measured = throughput(runs["paths"])
    assert measured.trials == len(records) and measured.runs == 3
    resumed = plan_class(runs["fleet"], "classa", runs["fleet"].models, runs["tasks"], records, measured)
    assert resumed.time_is_the_budget and resumed.done == len(records)
    assert resumed.remaining == resumed.budget - len(records) == int(TIME_LIMIT_S / measured.seconds_per_trial)
    assert f"s per trial measured over {len(records)} trials in 3 runs" in resumed.format()


def test_a_task_stops_at_its_knee_and_not_before():
    gain = EarlyStop(window=8, min_gain=0.05)
    flat = [1.0] * 4 + [0.99] * 8  # 1 % better over the last 8: at its knee
    assert reached_knee(flat, gain)
    assert not reached_knee([1.0] * 4 + [0.9] * 8, gain)  # 10 % better: still gaining
    assert not reached_knee([1.0] * 8, gain)  # not more trials than the window: too early to tell
    assert not reached_knee([None] * 4 + [1.0] * 8, gain)  # nothing valid before the window
    assert not reached_knee(flat, None)  # early stop off


def test_the_next_round_goes_to_the_task_with_fewest_rounds_then_to_tasks_still_gaining():
    def ledger(share, history, rounds=0, spent=0, ceiling=100):
        return TaskLedger(f"h{share}{rounds}", 1.0, share, ceiling, list(history), spent=spent, rounds=rounds)

    ledgers = [ledger(8, [], rounds=1, spent=4), ledger(8, []), ledger(8, [])]
    assert choose_task(ledgers, [True] * 3, {}, 20, 4, 4) == 1  # no second round before every first
    assert choose_task(ledgers, [True, False, True], {}, 20, 4, 4) == 2  # a finished task is skipped
    at_knee = ledger(8, [1.0] * 8, rounds=2, spent=8)
    still = ledger(4, [2.0] * 4 + [1.0] * 4, rounds=1, spent=4)
    unknown = ledger(4, [1.0] * 4, rounds=1, spent=4)
    assert stop_at_knee(at_knee, EarlyStop(window=4, min_gain=0.01)) and at_knee.stopped.startswith("knee")
    trio = [at_knee, still, unknown]
    assert choose_task(trio, [True] * 3, {}, 8, 4, 4) == 2  # too few trials to tell: first served
    assert trio[2].share == 8  # granted one round
    trio[2].spent, trio[2].history = 8, [1.0] * 8
    assert choose_task(trio, [True] * 3, {}, 4, 4, 4) == 1  # then the one that gained
    trio[1].spent = 8  # its granted round measured
    assert choose_task(trio, [True] * 3, {}, 0, 4, 4) is None  # nothing left to give
    capped = [ledger(4, [1.0] * 4, rounds=1, spent=4, ceiling=4)]
    assert choose_task(capped, [True], {}, 8, 4, 4) is None  # at its ceiling


def test_a_short_round_leaves_room_that_waits_for_a_task_the_plan_gave_no_share():
    short = TaskLedger("short", 1.0, share=4, ceiling=100, history=[1.0] * 3, spent=3, rounds=1)
    unplanned = TaskLedger("unplanned", 1.0, share=0, ceiling=100, history=[])
    assert choose_task([short, unplanned], [True, True], {}, 8, 4, 4) == 1
    assert unplanned.share == 4
    unplanned.spent, unplanned.rounds, unplanned.history = 4, 1, [1.0] * 4
    assert choose_task([short, unplanned], [True, True], {}, 4, 4, 4) == 0  # then its room is used
    assert (
        choose_task([short, TaskLedger("u", 1.0, 0, 100, [])], [True, True], {}, 0, 4, 4) == 0
    )  # no budget: room only


@derived_object
class _Rounds(PyMeasureCallback):
    """Counts each round on the run's ledgers, as the tuner's monitor does, and keeps its size."""

    def __init__(self, state: RunState, sizes: list[int]) -> None:
        super().__init__()
        self.state, self.sizes = state, sizes

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        self.state.record(task_id, list(runner_results))
        self.sizes.append(len(runner_results))


@pytest.mark.fleet  # a real tuning run (LocalRunner)
def test_a_task_whose_search_space_ran_out_stops_at_its_first_empty_round(tmp_path):
    data = te.placeholder((4,), "float32", name="data")
    relu = te.compute((4,), lambda i: te.max(data[i], tvm.tirx.const(0.0, "float32")), name="relu")
    host = tvm.target.Target({"kind": "llvm", "num-cores": 1})  # a 4-float ReLU: a handful of schedules
    load_cpu_intrinsics(host)  # as the class process does: TuneContext would import all of TVM's (15-50 s)
    context = ms.TuneContext(
        mod=tvm.IRModule({"main": te.create_prim_func([data, relu])}),
        target=host,
        space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(population_size=16, genetic_num_iters=1),
        task_name="relu",
    )
    budget = 40
    ledger = TaskLedger("relu", weight=1.0, share=budget, ceiling=budget, history=[])
    state = RunState(
        device_class="host",
        task_calls={},
        ledgers=[ledger],
        names=["relu"],
        run_budget=budget,
        trials_per_iter=PER_ITER,
        early_stop=None,
        time_limit_s=None,
    )
    sizes: list[int] = []
    (tmp_path / "candidates").mkdir()
    ms.tune.tune_tasks(
        tasks=[context],
        task_weights=[1.0],
        work_dir=str(tmp_path),
        max_trials_global=budget,
        max_trials_per_task=budget,
        num_trials_per_iter=PER_ITER,
        builder=make_builder(str(tmp_path / "candidates"), None, max_workers=1),
        runner=ms.runner.LocalRunner(),
        database=ms.database.MemoryDatabase(),
        cost_model=ms.cost_model.RandomModel(),
        measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), _Rounds(state, sizes)],
        task_scheduler=BudgetScheduler(state),
    )
    assert 0 < ledger.spent < budget and None not in ledger.history  # fewer schedules than its budget, all measured
    assert ledger.stopped == SEARCH_SPACE_END
    assert sizes[-1] == 0 and 0 not in sizes[:-1]  # stopped at the first round that found nothing new
    assert ledger.rounds == len(sizes)
    assert state.stopped == "every task reached its knee, its cap or the end of its search space"
