"""Time to parity on given numbers: the first trial (and minute of the class's tuning clock) at
which a model's estimate reaches its faster runtime's time, as summary.json and the build table
say it; the clock and runtime records of the class database; and the scheduler's rounds by gain
going to the models still slower than their faster runtime first."""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import replace

from support.fleets import V3, make_fleet
from support.onnx_samples import conv_model
from support.synthetic_fleet import write_synthetic_fleet
from support.tests_samples import sample_inputs, sample_manifest

from edgetune.artifact.release import BuildOutcome, BuildReport
from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import REPORT_DIR
from edgetune.artifact_format.signing import init_keys, load_private_key
from edgetune.compiler.tasks import KernelTask
from edgetune.report import render
from edgetune.tune.budget import ParityBar, ParityBars, TaskLedger, choose_task
from edgetune.tune.database import (
    ClassDatabasePaths,
    ClockLine,
    RuntimesLine,
    RuntimeTime,
    TrialRecord,
    append_clock,
    append_run,
    append_runtimes,
    clock_lines,
)
from edgetune.tune.parity import TuningClock, measure_runtimes, model_key, parity_bars, recorded_runtimes
from edgetune.tune.report import (
    NOT_MEASURED,
    NOT_YET,
    ParityPoint,
    RunInfo,
    parity_point,
    read_summary,
    write_model_report,
)

# mlp: a once, b twice; untuned 9 ms + 2 x 5 ms = 19 ms
TASKS = (KernelTask("dense_a", "a", 1e6, 1.0, (("mlp", 1),)), KernelTask("dense_b", "b", 1e6, 2.0, (("mlp", 2),)))
UNTUNED = {"a": 9e-3, "b": 5e-3}
TRIALS = [
    TrialRecord("other", 1e-9),  # another model's kernel: not one of mlp's trials
    TrialRecord("a", 4e-3),  # mlp's trial 1: 4 + 10 = 14 ms
    TrialRecord("b", None),  # trial 2, failed
    TrialRecord("b", 3e-3),  # trial 3: 4 + 6 = 10 ms
    TrialRecord("a", 2e-3),  # trial 4: 2 + 6 = 8 ms
]
# the clock: the run's start mark, then a round of 3 records and one of 2
CLOCK = [ClockLine(0, 30.0, start=True), ClockLine(3, 90.0), ClockLine(5, 186.0)]


def runtimes(**milliseconds: float) -> dict[str, RuntimeTime]:
    return {name: RuntimeTime(f"{name} 1.0, 1 thread", ms / 1e3) for name, ms in milliseconds.items()}


def test_parity_is_the_first_trial_whose_estimate_reaches_the_faster_runtime_and_when_it_was_recorded():
    point = parity_point(TASKS, "mlp", TRIALS, UNTUNED, runtimes(onnxruntime=12.0, openvino=10.5), CLOCK)
    # 14 ms after trial 1, 10 ms after trial 3: at or below openvino's 10.5 ms (the faster runtime)
    assert point == ParityPoint(3, 3.1, "openvino", 10.5e-3, point.estimate_s)
    assert round(point.estimate_s * 1e3, 6) == 10.0
    assert point.text() == "trial 3, 3.1 min vs openvino"  # its record, the 4th, came with the round recorded at 186 s


def test_a_model_already_faster_untuned_parities_at_trial_0_when_the_run_had_measured_it():
    point = parity_point(TASKS, "mlp", TRIALS, UNTUNED, runtimes(onnxruntime=25.0), CLOCK)
    assert (point.trial, point.minute, point.runtime) == (0, 0.5, "onnxruntime")  # 19 ms <= 25 ms, at the start mark
    assert round(point.estimate_s * 1e3, 6) == 19.0


def test_a_model_still_slower_than_its_runtime_has_no_parity_yet_and_one_never_timed_is_not_measured(tmp_path):
    assert parity_point(TASKS, "mlp", TRIALS, UNTUNED, runtimes(onnxruntime=7.9), CLOCK) is None
    assert parity_point(TASKS, "mlp", TRIALS, UNTUNED, {}, CLOCK) is None
    slower = read_summary(written(tmp_path / "slower", runtimes(onnxruntime=7.9)))
    assert (slower.parity, slower.time_to_parity, set(slower.runtimes)) == (None, NOT_YET, {"onnxruntime"})
    builtin = read_summary(written(tmp_path / "builtin", {}))
    assert (builtin.parity, builtin.time_to_parity) == (None, NOT_MEASURED)


def test_an_estimate_missing_a_kernel_is_no_parity():
    """Without b's untuned time, mlp's estimate exists only once b has a measured latency."""
    point = parity_point(TASKS, "mlp", TRIALS, {"a": 9e-3}, runtimes(onnxruntime=11.0), CLOCK)
    assert point.trial == 3  # not trial 1, where a alone (4 ms) would be under the bar


def test_a_trial_recorded_before_the_clock_was_kept_has_no_minute():
    later_run = [ClockLine(5, 300.0, start=True)]  # the records were there before the clock's first line
    point = parity_point(TASKS, "mlp", TRIALS, UNTUNED, runtimes(onnxruntime=10.0), later_run)
    assert (point.trial, point.minute, point.text()) == (3, None, "trial 3 vs onnxruntime")


def written(directory, times: dict[str, RuntimeTime]):
    run = RunInfo("gw", {"kind": "llvm"}, "db", None, 5, 186.0, None, {}, {})
    return write_model_report(directory, "mlp", TASKS, TRIALS, run, UNTUNED, times, CLOCK)


# a kernel `prepare` scheduled itself (a move), twice in mlp: never searched, 1 ms a call when measured
SCHEDULED = (KernelTask("move", "m", 0.0, 2.0, (("mlp", 2),)),)


def test_kernels_prepare_scheduled_count_in_every_estimate_at_their_measured_time(tmp_path):
    run = RunInfo("gw", {"kind": "llvm"}, "db", None, 5, 186.0, None, {}, {})
    times = runtimes(onnxruntime=10.0)
    plain = read_summary(write_model_report(tmp_path / "plain", "mlp", TASKS, TRIALS, run, UNTUNED, times, CLOCK))
    path = write_model_report(
        tmp_path / "moves", "mlp", TASKS, TRIALS, run, {**UNTUNED, "m": 1e-3}, times, CLOCK, SCHEDULED
    )
    summary = read_summary(path)
    assert summary.scheduled_latency_s == 2e-3 and plain.scheduled_latency_s == 0.0
    assert round(summary.estimated_latency_s * 1e3, 6) == 10.0  # 8 ms of searched kernels + 2 x 1 ms
    assert round(summary.untuned_latency_s * 1e3, 6) == 21.0
    shifted = [(p.trials, round((p.latency_s - 2e-3) * 1e3, 6)) for p in summary.curve_points()]
    assert shifted == [(p.trials, round(p.latency_s * 1e3, 6)) for p in plain.curve_points()]
    assert [round(p.latency_s * 1e3, 6) for p in summary.early_points()] == [21.0, 16.0, 16.0]
    # 10 ms of onnxruntime: without the moves reached at trial 3, with them only at trial 4
    assert (plain.parity.trial, summary.parity.trial) == (3, 4)
    unmeasured = write_model_report(
        tmp_path / "unmeasured", "mlp", TASKS, TRIALS, run, UNTUNED, times, CLOCK, SCHEDULED
    )
    assert read_summary(unmeasured).scheduled_latency_s is None  # left out of the estimate until measured
    assert read_summary(unmeasured).estimated_latency_s == plain.estimated_latency_s


def test_summary_json_carries_the_runtimes_and_the_parity_point_and_the_build_table_its_text(tmp_path):
    path = written(tmp_path, runtimes(onnxruntime=12.0, openvino=10.5))
    raw = json.loads(path.read_text())
    assert raw["time_to_parity"] == "trial 3, 3.1 min vs openvino"
    assert raw["parity"]["trial"] == 3 and raw["runtimes"]["openvino"]["seconds"] == 10.5e-3
    summary = read_summary(path)
    assert summary.parity.minute == 3.1 and summary.runtimes["onnxruntime"].runtime == "onnxruntime 1.0, 1 thread"
    old = {k: v for k, v in raw.items() if k not in ("runtimes", "parity", "time_to_parity")}
    path.write_text(json.dumps(old))  # as written before these fields existed
    assert read_summary(path).time_to_parity == NOT_MEASURED
    report = BuildReport((BuildOutcome("mlp", "gw", "built", tuned_ms=1.0, parity=summary.time_to_parity),))
    header, _, row = report.table().splitlines()
    assert row[header.index("parity") :].startswith("trial 3, 3.1 min vs openvino")


def test_the_dashboard_shows_each_versions_time_to_parity_from_the_report_it_ships(tmp_path):
    fleet = write_synthetic_fleet(tmp_path, 4)
    init_keys(fleet.artifacts.signing_key, fleet.artifacts.public_key, fleet.artifacts.dir)
    store = ArtifactStore(fleet.artifacts.dir)
    for device_class, times in (("gw-fast", runtimes(openvino=10.5)), ("gw-slow", runtimes(onnxruntime=1.0))):
        with store.stage("mlp", device_class) as staging:
            (staging.path / "model.so").write_bytes(b"\x7fELF-library")
            written(staging.path / REPORT_DIR, times)
            manifest = sample_manifest(sample_inputs(device_class=device_class))
            store.commit(staging, manifest, load_private_key(fleet.artifacts.signing_key))
    html = render(fleet).decode()
    assert "<th>parity</th>" in html
    rows = re.findall(r"<tr><td>mlp</td><td>(gw-[a-z]+)</td>(.*?)</tr>", html)
    parity = {device_class: re.findall(r"<td[^>]*>.*?</td>", cells)[7] for device_class, cells in rows}
    assert parity == {
        "gw-fast": "<td class=parity>trial 3, 3.1 min vs openvino</td>",
        "gw-slow": "<td class=missing>not yet</td>",
    }


def test_the_clock_counts_on_from_the_earlier_runs_and_marks_each_recorded_round(tmp_path):
    paths = ClassDatabasePaths(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    append_run(paths, 8, 100.0, 1)
    append_clock(paths, ClockLine(8, 95.0))
    clock = TuningClock(paths, time.monotonic() - 2.0)  # this run took the database 2 s ago
    clock.start()
    clock.advance(4)
    start, round_ = clock_lines(paths)[1:]
    assert start.start and start.trials == 0 and 102.0 <= start.seconds < 110.0  # runs.jsonl's 100 s, then 2 s
    assert (round_.trials, round_.start) == (4, False) and round_.seconds >= start.seconds
    assert TuningClock(paths, time.monotonic()).offset >= round_.seconds  # a run cut short: the clock still counts


def test_runtime_times_are_recorded_per_model_file_inputs_and_board_threads(tmp_path):
    model = conv_model(tmp_path / "conv.onnx")
    fleet = make_fleet(tmp_path, 9190, {"gw": V3}, {"gw": 1}, (model,), 16)
    paths = ClassDatabasePaths.of(fleet.workdir, "gw")
    paths.directory.mkdir(parents=True)
    times = runtimes(onnxruntime=1.5)
    append_runtimes(paths, RuntimesLine(model_key(model.onnx, model.inputs), "gw-0", 1, times))
    assert recorded_runtimes(fleet, "gw", [model], paths) == {model.name: times}
    other_shape = replace(model, inputs=(replace(model.inputs[0], shape=(2, 3, 16, 16)),))
    assert model_key(model.onnx, other_shape.inputs) != model_key(model.onnx, model.inputs)
    assert recorded_runtimes(fleet, "gw", [other_shape], paths) == {}
    two_threads = fleet.replace(boards=(replace(fleet.boards[0], threads=2),))
    assert recorded_runtimes(two_threads, "gw", [model], paths) == {}


def test_runtimes_that_cannot_be_timed_are_logged_and_nothing_is_recorded(tmp_path, caplog):
    model = conv_model(tmp_path / "conv.onnx")
    fleet = make_fleet(tmp_path, 9193, {"gw": V3}, {"gw": 1}, (model,), 16)  # no tracker listens there
    paths = ClassDatabasePaths.of(fleet.workdir, "gw")
    paths.directory.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="edgetune.tune.parity"):
        measure_runtimes(fleet, "gw", [model], paths)  # returns: a class run goes on
    assert "[gw] runtimes not timed on gw-0: tracker 127.0.0.1:9193 does not answer" in caplog.text
    assert "[gw] no board gave a session: time to parity is not measured this run" in caplog.text
    assert not paths.runtimes.exists()


def ledger(name: str, history: list[float | None], rounds: int = 1) -> TaskLedger:
    return TaskLedger(
        name, 1.0, share=len(history), ceiling=100, history=list(history), spent=len(history), rounds=rounds
    )


def test_rounds_by_gain_go_to_the_kernels_of_a_model_still_slower_than_its_runtime_first():
    def ledgers(slow_stopped: str | None = None) -> list[TaskLedger]:
        # "fast" gains most per round, but its model is already faster than its runtime; "slow"'s is not
        slow = ledger("slow", [5e-3, 5e-3, 5e-3, 5e-3, 4.9e-3])
        slow.stopped = slow_stopped
        return [ledger("fast", [9e-3, 8e-3, 7e-3, 6e-3, 2e-3]), slow]

    bars = ParityBars((ParityBar({"fast": 1}, 3e-3), ParityBar({"slow": 1}, 1e-3)))
    assert bars.behind(ledgers()) == {"slow"}
    assert choose_task(ledgers(), [True, True], {}, 8, 4, 4) == 0  # without bars: the largest expected gain
    assert choose_task(ledgers(), [True, True], {}, 8, 4, 4, bars.behind(ledgers())) == 1
    assert choose_task(ledgers("knee"), [True, True], {}, 8, 4, 4, {"slow"}) == 0  # nothing behind left to take it
    unstarted = TaskLedger("new", 1.0, share=0, ceiling=100, history=[])
    assert choose_task([*ledgers(), unstarted], [True] * 3, {}, 8, 4, 4, {"slow"}) == 2  # a first round comes first


def test_first_rounds_go_to_the_kernels_of_a_model_still_slower_than_its_runtime_first():
    """A time budget's plan gives every task a first round; the slower model's tasks take theirs first."""

    def planned() -> list[TaskLedger]:
        return [TaskLedger(name, 1.0, share=4, ceiling=100, history=[]) for name in ("a", "b", "c")]

    assert choose_task(planned(), [True] * 3, {}, 12, 4, 4) == 0  # in the plan's order
    assert choose_task(planned(), [True] * 3, {}, 12, 4, 4, {"c"}) == 2
    started = planned()
    started[2].spent, started[2].rounds = 4, 1
    assert choose_task(started, [True] * 3, {}, 8, 4, 4, {"c"}) == 0  # every task gets a round before any a second


def test_the_bars_start_from_the_recorded_trials_and_untuned_times_and_follow_the_run():
    bars = parity_bars(TASKS, {"mlp": runtimes(onnxruntime=9.0, openvino=12.0)}, TRIALS, UNTUNED)
    assert bars.bars == (ParityBar({"a": 1, "b": 2}, 9e-3),)
    assert (bars.known["a"], bars.known["b"]) == (2e-3, 3e-3)  # best recorded (8 ms for mlp: not behind its 9 ms)
    assert bars.behind([]) == frozenset()
    assert parity_bars(TASKS, {"mlp": runtimes(onnxruntime=7.0)}, TRIALS, UNTUNED).behind([]) == {"a", "b"}
    untuned_only = parity_bars(TASKS, {"mlp": runtimes(onnxruntime=7.0)}, [], UNTUNED)
    assert untuned_only.behind([ledger("a", [1e-3]), ledger("b", [2e-3])]) == frozenset()  # 5 ms: the run got there
    assert parity_bars(TASKS, {}, TRIALS, UNTUNED).behind([]) == frozenset()  # no runtime timed: nobody is behind


def test_the_bar_of_the_searched_kernels_is_the_runtimes_time_less_the_kernels_prepare_scheduled():
    """mlp's searched kernels take 8 ms, its moves 2 ms: behind onnxruntime's 9 ms, though 8 < 9."""
    bars = parity_bars(TASKS, {"mlp": runtimes(onnxruntime=9.0)}, TRIALS, {**UNTUNED, "m": 1e-3}, SCHEDULED)
    ((bar),) = bars.bars
    assert bar.calls == {"a": 1, "b": 2} and round(bar.seconds * 1e3, 6) == 7.0
    assert bars.behind([]) == {"a", "b"}
    assert bars.behind([ledger("a", [0.5e-3])]) == frozenset()  # 0.5 + 6 ms: the run got there
