"""Kernels that index with a runtime input are measured with arguments in range, and a candidate
that crashes its board's session costs one trial: the class run waits for the board's watchdog to
bring it back and goes on to spend its budget (issue 29, item 1). Fleet tests run on a loopback
fleet of their own."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.fleets import V3, make_fleet
from support.onnx_samples import save
from tvm import rpc
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

import edgetune.tune.runner
from edgetune.fleet.tracker import RpcEndpoint
from edgetune.inventory.schema import Model, ModelInput
from edgetune.tune.database import ClassDatabasePaths, read_trials, untuned_times
from edgetune.tune.index_inputs import ZEROS, InRangeArguments, index_bounds, signature
from edgetune.tune.monitor import BoardGuardRunner
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

TABLE_ROWS = 1000
WILD_INDEX = 1 << 40  # an embedding row 2^47 bytes past the table: outside any process's memory
SEARCH = SearchSettings(population_size=32, genetic_num_iters=1)
BUDGET = 6  # the take and the index normalisation have one schedule each; the matmul takes the rest


def embedding_model(directory: Path) -> Model:
    """An embedding lookup (Gather of a 1000 x 32 constant table by an int64 input [1, 8]) and a
    matmul: three tasks (the index normalisation, the take, the matmul; NCHW keeps the matmul one
    kernel; `auto` writes it as a pointwise convolution, its two reshapes two more kernels)."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((TABLE_ROWS, 32)).astype("float32"), "table"),
        numpy_helper.from_array(rng.standard_normal((32, 16)).astype("float32"), "w"),
    ]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["embedded"], axis=0),
        helper.make_node("MatMul", ["embedded", "w"], ["y"]),
    ]
    path = save(
        directory / "embedding.onnx",
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        weights,
    )
    return Model(name="embedding", inputs=(ModelInput("ids", (1, 8), "int64"),), onnx=path, layout="NCHW")


@T.prim_func(s_tir=True)
def scatter(
    data: T.Buffer((16, 4), "float32"),
    ids: T.Buffer((3,), "int32"),
    updates: T.Buffer((3, 4), "float32"),
    out: T.Buffer((16, 4), "float32"),
):
    for i, j in T.grid(16, 4):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = data[vi, vj]
    for i, j in T.grid(3, 4):
        with T.sblock("scatter"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[T.Cast("int64", ids[vi]), vj] = updates[vi, vj]


@T.prim_func(s_tir=True)
def indirect_take(
    table: T.Buffer((100, 4), "float32"),
    ids: T.Buffer((8,), "int64"),
    offsets: T.Buffer((8,), "int64"),
    out: T.Buffer((8, 4), "float32"),
):
    shifted = T.sblock_alloc_buffer((8,), "int64")
    for i in range(8):
        with T.sblock("shift"):
            vi = T.axis.remap("S", [i])
            shifted[vi] = ids[vi] + T.int64(1)
    for i, j in T.grid(8, 4):
        with T.sblock("take"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = table[shifted[vi] + offsets[vi], vj]


def test_an_input_that_indexes_an_axis_is_bounded_by_its_extent():
    assert index_bounds(scatter) == (None, 16, None, None)  # a store's index counts, casts aside


def test_an_input_whose_bound_cannot_be_read_off_is_filled_with_zeros():
    assert index_bounds(indirect_take) == (None, ZEROS, ZEROS, None)


def test_index_inputs_are_allocated_in_range_and_the_others_at_random():
    session = rpc.LocalSession()
    args_info = [["TENSOR", "float32", [16, 4]], ["TENSOR", "int32", [3]], ["TENSOR", "int32", [5]]]
    allocate = InRangeArguments({signature(args_info): (None, 16, None)})
    (table, ids, data), again = allocate(session, session.cpu(0), args_info, 2)
    assert ids.numpy().min() >= 0 and ids.numpy().max() < 16
    assert np.abs(data.numpy()).max() >= 16  # not an index: MetaSchedule's random fill
    assert not np.array_equal(table.numpy(), again[0].numpy())


def _one_board_fleet(loopback, tmp_path: Path, trials: int):
    loopback.start_board("a1", "classa")
    loopback.wait_registered(1)
    fleet = make_fleet(
        tmp_path,
        loopback.port,
        {"classa": V3},
        {"classa": 1},
        (embedding_model(tmp_path),),
        trials,
        per_iter=2,
        per_task=32,
    )
    return fleet, ClassDatabasePaths.of(tmp_path, "classa")


def test_a_model_that_gathers_by_an_input_tunes_every_task_without_losing_a_board(loopback, tmp_path):
    fleet, paths = _one_board_fleet(loopback, tmp_path, trials=BUDGET)
    tuned = tune_class(fleet, "classa", TuneOptions(search=SEARCH))
    assert tuned.ok and tuned.stopped is None, tuned
    trials = read_trials(paths)
    assert len(trials) == tuned.trials_run == BUDGET
    assert all(t.latency_s is not None for t in trials)
    assert len({t.workload_hash for t in trials}) == 3  # every task measured
    # No session died of a signal (an index out of range: SIGSEGV, TVM logs "error code -11").
    # A session the host closes while it serves may end with code 1 on a loaded machine.
    assert "exited unsuccessfully with error code -" not in (loopback.directory / "a1.log").read_text()


@dataclass(frozen=True)
class CrashingOnce:
    """`f_alloc_argument` that, the `nth` time it allocates for a kernel that indexes with an
    input (counted over all measurement workers: `marker`.N files are created exclusively),
    points that input far outside the table: the candidate then reads unmapped memory and its
    session dies of SIGSEGV."""

    in_range: InRangeArguments
    marker: str
    nth: int

    def __call__(self, session, device, args_info, alloc_repeat):
        repeated = self.in_range(session, device, args_info, alloc_repeat)
        bounds = self.in_range.bounds.get(signature(args_info))
        if bounds is not None and self._count() == self.nth:
            for args in repeated:
                for tensor, bound in zip(args, bounds):
                    if bound is not None:
                        tensor.copyfrom(np.full(tensor.shape, WILD_INDEX, str(tensor.dtype)))
        return repeated

    def _count(self) -> int:
        """This allocation's number (1, 2, ...)."""
        count = 1
        while True:
            try:
                os.close(os.open(f"{self.marker}.{count}", os.O_CREAT | os.O_EXCL))
                return count
            except FileExistsError:
                count += 1


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the measurement workers cannot import tests


@pytest.mark.parametrize("crash_at", ["untuned", "trial"])
def test_a_candidate_that_crashes_its_session_costs_one_trial_and_the_run_spends_its_budget(
    loopback, tmp_path, monkeypatch, crash_at
):
    """The gather kernel is measured first untuned (before the first round), then in trials: a
    crash there costs its untuned time, a crash in a trial that trial; the run goes on either way."""
    fleet, paths = _one_board_fleet(loopback, tmp_path, trials=BUDGET)
    nth = 1 if crash_at == "untuned" else 2
    monkeypatch.setattr(
        edgetune.tune.runner,
        "InRangeArguments",
        lambda bounds: CrashingOnce(InRangeArguments(bounds), str(tmp_path / "allocated"), nth),
    )
    tuned = tune_class(fleet, "classa", TuneOptions(search=SEARCH))  # in this process: the hook stays in place
    board_log = (loopback.directory / "a1.log").read_text()
    assert "exited unsuccessfully with error code -11" in board_log  # a real segfault of the session
    assert "starting a new one" in board_log  # the watchdog brought the board back
    assert tuned.ok and tuned.stopped is None, tuned
    trials = read_trials(paths)
    assert len(trials) == tuned.trials_run == BUDGET  # the run went on to spend its budget
    assert len({t.workload_hash for t in trials}) == 3
    untuned = untuned_times(paths)
    assert len(untuned) == 3
    if crash_at == "untuned":
        assert [seconds is None for seconds in untuned.values()].count(True) == 1  # the gather's
        assert all(t.latency_s is not None for t in trials)
    else:
        assert all(seconds is not None for seconds in untuned.values())
        assert sum(t.latency_s is None for t in trials) == 1  # the crash cost one trial


def test_a_class_whose_boards_do_not_come_back_fails_its_batch_after_the_grace_period(loopback):
    guard = BoardGuardRunner(
        RpcEndpoint("127.0.0.1", loopback.port, "classa"), 1, runner=None, exclusive=False, return_grace_s=2.0
    )
    started = time.monotonic()
    (future,) = guard.run([ms.runner.RunnerInput("candidate.so", "cpu", [])])
    assert 2.0 <= time.monotonic() - started < 10.0
    assert guard.boards_lost
    assert "no board of class classa registered with the tracker" in future.result().error_msg
