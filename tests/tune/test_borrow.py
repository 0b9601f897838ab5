"""Borrowing (transfer tuning) for real, on a loopback fleet of the test's own.

`classb` (x86-64-v2) may borrow from `classa` (AVX-512): tuned in one run, classa goes first
and classb's database then starts with classa's best schedules, re-measured on classb's board.
`classc` (x86-64-v2 too, also allowed to borrow) is tuned with `--no-borrow` afterwards: the
baseline of the same target and budget. One board per class, so a board's log tells which
measurements it ran.

The same boards then serve starter records: built from classa's database for a profile of
classc's target, they seed a class run of mlp at other shapes (every kernel transferred), and a
run with `starters=False` takes none.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from support.fleet_marker import starts_fleet
from support.fleets import V2, V3, make_fleet, mlp
from support.loopback_boards import Loopback
from tvm.s_tir import meta_schedule as ms

from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.database import ClassDatabasePaths, read_trials, untuned_times
from edgetune.tune.monitor import load_cost_model
from edgetune.tune.starters import build_starters, starters_dir
from edgetune.tune.tuner import TuneOptions, tune_class, tune_fleet

BUDGET = 16  # mlp: 2 tasks of 8 trials; the borrower seeds each with 4 of the donor's best
PER_ITER = 8
CLASSES = ("classa", "classb", "classc")


@pytest.fixture(scope="module")
@starts_fleet
def borrowing(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("borrow")
    loopback = Loopback(workdir)
    try:
        for name in CLASSES:
            loopback.start_board(name, name)
        loopback.wait_registered(len(CLASSES))
        fleet = make_fleet(
            workdir,
            loopback.port,
            {"classa": V3, "classb": V2, "classc": V2},
            {name: 1 for name in CLASSES},
            (mlp(),),
            BUDGET,
            PER_ITER,
            16,
            borrow={"classb": "classa", "classc": "classa"},
        )
        first = tune_fleet(fleet, TuneOptions(classes=("classa", "classb")))
        again = tune_fleet(fleet, TuneOptions(classes=("classa", "classb")))
        baseline = tune_fleet(fleet, TuneOptions(classes=("classc",), borrow=False))
        yield fleet, {c.device_class: c for c in (*first.classes, *baseline.classes)}, again
    finally:
        loopback.close()


def _records(fleet, device_class: str) -> list[tuple[str, list, list[float], dict]]:
    """(workload hash, trace, run_secs, target) of every record, in the order measured."""
    return _records_at(ClassDatabasePaths.of(fleet.workdir, device_class).directory)


def _records_at(directory: Path) -> list[tuple[str, list, list[float], dict]]:
    paths = ClassDatabasePaths(directory)
    hashes = [json.loads(line)[0] for line in paths.workload.open()]
    return [
        (hashes[w], trace, secs, target) for w, (trace, secs, target, _) in map(json.loads, paths.tuning_record.open())
    ]


def _measurements_on_board(fleet, board: str) -> int:
    """Candidates the board's rpc_server loaded (one per measurement)."""
    return (fleet.workdir / f"{board}.log").read_text().count("load_module")


def _untuned(fleet, device_class: str) -> int:
    """Kernels the class measured untuned (once each, before its first round)."""
    return len(untuned_times(ClassDatabasePaths.of(fleet.workdir, device_class)))


def _summary(result) -> dict:
    return json.loads(open(result.summaries[0]).read())


def test_borrower_starts_from_the_donors_best_schedules_measured_on_its_own_board(borrowing):
    fleet, results, _ = borrowing
    assert all(r.ok for r in results.values()), {n: r.error for n, r in results.items()}
    donor = _records(fleet, "classa")
    borrowed = _records(fleet, "classb")[: results["classb"].borrowed_trials]
    assert {h for h, *_ in borrowed} == {h for h, *_ in donor}  # every task was seeded
    assert len(borrowed) == len({h for h, *_ in donor}) * PER_ITER // 2
    for workload, trace, run_secs, target in borrowed:
        donor_runs = [(t, s) for h, t, s, _ in donor if h == workload]
        assert trace in [t for t, _ in donor_runs]  # one of classa's schedules,
        assert run_secs not in [s for _, s in donor_runs]  # measured again,
        assert target["mcpu"] == V2["mcpu"] and max(run_secs) < 1.0  # for classb, successfully
    # ... on classb's board: it ran every classb trial (and measured each kernel untuned before
    # them), classa's board none of them
    assert _measurements_on_board(fleet, "classb") == results["classb"].trials_run + _untuned(fleet, "classb")
    assert _measurements_on_board(fleet, "classa") == results["classa"].trials_run + _untuned(fleet, "classa")
    assert results["classa"].trials_run == len(donor)


def test_borrowed_trials_count_against_the_budget_and_a_rerun_spends_none(borrowing):
    fleet, results, again = borrowing
    borrower = results["classb"]
    assert borrower.borrowed_trials > 0
    assert BUDGET <= borrower.trials_run < BUDGET + PER_ITER
    assert len(read_trials(ClassDatabasePaths.of(fleet.workdir, "classb"))) == borrower.trials_run
    assert again.ok and again.trials_run == 0


def test_borrowed_trials_train_the_borrowers_cost_model(borrowing):
    fleet, results, _ = borrowing
    model = ms.cost_model.XGBModel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # xgboost's format guess is not printed on every load
        load_cost_model(model, ClassDatabasePaths.of(fleet.workdir, "classb").cost_model)
    # every trial of the run, the re-measured borrowed schedules included, is in its training data
    assert sum(len(group.costs) for group in model.data.values()) == results["classb"].trials_run


def test_no_borrow_tunes_from_scratch(borrowing):
    _, results, _ = borrowing
    assert results["classc"].borrowed_trials == 0
    assert _summary(results["classc"])["borrowed_from"] is None


def test_summary_records_the_donor_and_trials_to_within_10pct(borrowing):
    _, results, again = borrowing
    with_borrow, without = _summary(results["classb"]), _summary(results["classc"])
    assert with_borrow["borrowed_from"] == "classa"
    assert _summary(again.classes[1])["borrowed_from"] == "classa"  # a re-run keeps it
    assert with_borrow["trials_to_within_10pct"] and without["trials_to_within_10pct"]
    # Seeded tasks give a whole-model estimate after half a round per task, before the baseline.
    assert with_borrow["curve"][0][0] < without["curve"][0][0]
    # Whether borrowing gets within 10 % of its own final estimate sooner varies run to run
    # at this budget (both finals differ); the numbers are printed, not asserted.
    print(
        f"mlp on x86-64-v2, {BUDGET} trials: within 10 % of the final estimate after "
        f"{with_borrow['trials_to_within_10pct']} trials with borrowing (first estimate "
        f"{with_borrow['curve'][0][1] * 1e6:.1f} us after {with_borrow['curve'][0][0]}, final "
        f"{with_borrow['estimated_latency_s'] * 1e6:.1f} us), {without['trials_to_within_10pct']} "
        f"without (first {without['curve'][0][1] * 1e6:.1f} us after {without['curve'][0][0]}, "
        f"final {without['estimated_latency_s'] * 1e6:.1f} us)"
    )


SMALL_PER_ITER = 2  # the starter run: mlp at 128 features, 2 tasks of a round of 2; seeding takes 1 each


@pytest.fixture(scope="module")
def starting(borrowing, tmp_path_factory):
    """classc's board tunes mlp at 128 features (classa tuned it at 256) from the starter records
    of classa's database, kept beside its profile, and again, in another workdir, with
    `starters=False`. Returns the starter records and (fleet, result, log lines) of each run."""
    fleet, _, _ = borrowing
    root = tmp_path_factory.mktemp("starters")
    profile = replace(fleet.device_class("classc").profile, path=root / "profiles" / "classc.yaml")
    small = Model(name="mlp", inputs=(ModelInput("x", (1, 128)),), builtin="mlp")

    def fleet_in(workdir: Path):
        return replace(
            fleet,
            workdir=workdir,
            device_classes=(replace(fleet.device_class("classc"), profile=profile),),
            boards=tuple(b for b in fleet.boards if b.device_class == "classc"),
            models=(small,),
            tuning=replace(
                fleet.tuning, trials_per_class=2 * SMALL_PER_ITER, trials_per_iter=SMALL_PER_ITER, borrow={}
            ),
        )

    with_starters, without = fleet_in(root / "with"), fleet_in(root / "without")
    built = build_starters(with_starters, "classc", [ClassDatabasePaths.of(fleet.workdir, "classa").directory], 4)
    assert built.directory == starters_dir(profile)
    lines, logger = _LogLines(), logging.getLogger("edgetune.tune.tuner")
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:  # in this process: no class process to start, and its log lines are at hand
        used = tune_class(with_starters, "classc", TuneOptions(borrow=False))
        first = len(lines.messages)
        unused = tune_class(without, "classc", TuneOptions(borrow=False, starters=False))
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    log = lines.messages
    return built, (with_starters, used, log[:first]), (without, unused, log[first:])


class _LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_starter_records_seed_kernels_of_other_shapes_by_transfer_and_are_measured_here(starting):
    built, (fleet, result, log), _ = starting
    assert result.ok, result.error
    assert any(
        line.startswith(
            f"[classc] starter records ({built.directory}): 0 tasks seeded exactly, 2 by transfer, 2 trials"
        )
        for line in log
    ), log
    starter_hashes = {h for h, *_ in _records_at(built.directory)}
    records = _records(fleet, "classc")
    seeded = records[: result.starter_trials]
    assert result.starter_trials == 2  # half a round for each of the two tasks
    assert {h for h, *_ in seeded} == {h for h, *_ in records}  # both tasks,
    assert not starter_hashes & {h for h, *_ in records}  # kernels the starters do not hold: transferred
    starter_traces = [t for _, t, *_ in _records_at(built.directory)]
    for _, trace, run_secs, target in seeded:
        assert trace not in starter_traces  # tiles adapted to the new shapes,
        assert target["mcpu"] == V2["mcpu"] and max(run_secs) < 1.0  # measured for classc, successfully
    budget = 2 * SMALL_PER_ITER  # the seeded trials count against it
    assert result.trials_run == len(records) and budget <= result.trials_run < budget + SMALL_PER_ITER
    assert _summary(result)["starter_trials"] == result.starter_trials


def test_a_run_without_starters_takes_none(starting):
    _, _, (_, result, log) = starting
    assert result.ok, result.error
    assert not [line for line in log if "starter records" in line], log  # though the profile has them
    assert result.starter_trials == 0
    assert _summary(result)["starter_trials"] == 0
