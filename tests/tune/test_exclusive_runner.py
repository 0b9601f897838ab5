"""The board runner on a real tracker and rpc_server (loopback): an exclusive runner hands
MetaSchedule its batch only once it is measured (boards that share the host's CPUs are not timed
while the host builds the next batch), the plain runner returns at once; a worker measures a
batch's candidates in one session, each candidate its own library; and a worker gives its board
back once it is idle, also when the tracker first handed it a dead one."""

from __future__ import annotations

import dataclasses
import gc
import time

import tvm
from support.fleets import V3, make_fleet, mlp
from tvm import rpc, te
from tvm.s_tir import meta_schedule as ms

from edgetune.fleet.tracker import RpcEndpoint, class_load
from edgetune.inventory.schema import Measurement, Simulation
from edgetune.tune.candidate_builder import make_builder
from edgetune.tune.monitor import BoardGuardRunner
from edgetune.tune.runner import make_runner
from edgetune.tune.tuner import TuneOptions, measures_exclusively

# Two repeats of at least 300 ms each: a batch cannot be measured in less than 0.6 s.
SLOW_MEASUREMENT = Measurement(number=1, repeat=2, min_repeat_ms=300)
MEASURED_AT_LEAST_S = 0.6
QUICK_MEASUREMENT = Measurement(number=1, repeat=1, min_repeat_ms=1)


def _candidate(tmp_path, size: int = 1024) -> ms.runner.RunnerInput:
    a = te.placeholder((size,), "float32", name="a")
    b = te.compute((size,), lambda i: a[i] * 2.0, name="b")
    func = te.create_prim_func([a, b])
    built = make_builder(str(tmp_path), None, max_workers=1).build(
        [ms.builder.BuilderInput(tvm.IRModule({"main": func}), tvm.target.Target("llvm"))]
    )[0]
    assert built.error_msg is None, built.error_msg
    return ms.runner.RunnerInput(built.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(func))


def _runner(loopback, exclusive: bool) -> BoardGuardRunner:
    endpoint = RpcEndpoint("127.0.0.1", loopback.port, "classa")
    return BoardGuardRunner(endpoint, 1, make_runner(endpoint, 1, SLOW_MEASUREMENT, {}), exclusive=exclusive)


def test_exclusive_runner_returns_the_batch_measured_and_the_plain_one_at_once(loopback, tmp_path):
    loopback.start_board("a1", "classa")
    loopback.wait_registered(1)
    candidate = _candidate(tmp_path)
    # Both runners live to the end: a runner dropped while its pool's thread still holds the
    # last future is collected in that thread, whose join of itself TVM reports as an error.
    exclusive, plain = _runner(loopback, exclusive=True), _runner(loopback, exclusive=False)

    started = time.monotonic()
    futures = exclusive.run([candidate, candidate])
    waited = time.monotonic() - started
    assert all(f.done() for f in futures)
    assert waited >= 2 * MEASURED_AT_LEAST_S  # one board: the two candidates one after the other
    results = [f.result() for f in futures]
    assert all(r.error_msg is None and len(r.run_secs) == 2 for r in results), results

    futures = plain.run([candidate])
    assert not futures[0].done()  # still measuring: the host may build meanwhile
    result = futures[0].result()
    assert result.error_msg is None and len(result.run_secs) == 2


def test_classes_with_a_simulated_board_measure_exclusively_unless_told_otherwise(tmp_path):
    real = make_fleet(tmp_path, 9000, {"a": V3}, {"a": 2}, (mlp(),), trials=8)
    one_simulated = real.replace(
        boards=tuple(
            dataclasses.replace(b, simulated=Simulation(cpu_quota=0.5)) if b.name == "a-1" else b for b in real.boards
        )
    )
    assert measures_exclusively(one_simulated, "a", TuneOptions())  # it would time the host's builds
    assert not measures_exclusively(real, "a", TuneOptions())  # real boards: the host does not disturb them
    assert not measures_exclusively(one_simulated, "a", TuneOptions(measure_exclusively=False))
    assert measures_exclusively(real, "a", TuneOptions(measure_exclusively=True))


def _poll(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_that_was_handed_a_dead_board_first_gives_the_live_one_back_when_it_is_done(loopback, tmp_path):
    """The tracker hands a worker a board that has just died, the worker asks again, measures on
    the live board, and is then idle: the live board is free again at once, not after its session
    timeout (which, with the class's other worker waiting for that board, stalled a run a minute).
    Without the runner's collection after each measurement the board stayed held in 6 of 8 rounds."""
    loopback.start_board("a1", "classa")
    loopback.wait_registered(1)
    endpoint = RpcEndpoint("127.0.0.1", loopback.port, "classa")
    candidate = _candidate(tmp_path)
    runner = make_runner(endpoint, 1, QUICK_MEASUREMENT, {})
    for _ in range(4):
        held = rpc.connect_tracker("127.0.0.1", loopback.port).request("classa", session_timeout=60)
        dead = loopback.register_dead_board("classa")  # the only free board, so the worker's first
        try:
            future = runner.run([candidate])[0]
            assert _poll(lambda: class_load(endpoint).pending == 1, 30.0)  # refused by it, it asks again
            del held
            gc.collect()  # this test's own session ends: the board is the worker's
            result = future.result()
            assert result.error_msg is None, result.error_msg
            assert _poll(lambda: class_load(endpoint).free == 1, 5.0), class_load(endpoint)
        finally:
            dead.close()


def test_a_worker_measures_its_batch_in_one_session_each_candidate_its_own_library(loopback, tmp_path):
    """Candidates of two sizes, alternating, on one board: one session for the batch (the
    board's log says each session it served), and each candidate timed as itself (every
    candidate is a `candidate.so`: a session that loaded the name once would run that library)."""
    loopback.start_board("a1", "classa")
    loopback.wait_registered(1)
    small, large = _candidate(tmp_path, 1024), _candidate(tmp_path, 1 << 22)
    runner = _runner(loopback, exclusive=True)
    board_log = loopback.directory / "a1.log"
    served = board_log.read_text().count("connected from")
    results = [f.result() for f in runner.run([small, large, small, large, small, large])]
    assert all(r.error_msg is None for r in results), results
    seconds = [min(r.run_secs) for r in results]
    assert min(seconds[1::2]) > 100 * max(seconds[0::2]), seconds  # 4096 times the elements
    assert board_log.read_text().count("connected from") - served == 1, board_log.read_text()
    assert _poll(lambda: class_load(runner.endpoint).free == 1, 5.0)  # idle: the board is back
