"""Measurement on a device class's boards: MetaSchedule's RPCRunner through the fleet tracker.

Boards of a class register with the tracker under the class name as key, so the tracker hands
each measurement to a free board of that class; as many measurements run at once as the class
has boards. A board that dies mid-measurement turns that candidate into a failed RunnerResult
(TVM's RPCRunner catches the broken session) and the tracker stops handing it out.
Inputs that a kernel indexes with are filled in range (`index_inputs.InRangeArguments`), so a
gather or an embedding lookup is measured instead of crashing the board's session.

A runner worker keeps its board's session from one measurement to the next (`HeldSession`),
opened through edgetune's tracker client (`fleet.tracker.request_session`), since opening one per
candidate costs board time (bench/README.md, trial rate). It gives the board back when it has been
idle for SESSION_IDLE_S (between rounds, or when the class's other worker waits for the only
live board) and before a measurement once the session is SESSION_REUSE_S old, so the board's
own session timeout never ends a session mid-measurement and no worker keeps a board for long.
A session that no longer answers (a candidate crashed it) is replaced before the next one.
TVM's sessions end only when freed, and a loaded file name stays cached in a session
(edgetune.tvm_compat.rpc_session): the workers collect garbage after each measurement and
upload each candidate under a name of its own.
"""

from __future__ import annotations

import gc
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import rpc
from tvm.s_tir import meta_schedule as ms

from edgetune.fleet.tracker import RpcEndpoint, request_session, wait_for_servers
from edgetune.inventory.schema import Measurement
from edgetune.tune.index_inputs import IndexBounds, InRangeArguments
from edgetune.tvm_compat.rpc_session import collect_after_each_measurement, freeze_imports, own_upload_name

SESSION_TIMEOUT_S = 60
SESSION_REUSE_S = 10.0  # a candidate starting on a held session has 50 s of its session timeout left
SESSION_IDLE_S = 0.5  # the next candidate of a round reaches its worker within milliseconds


def wait_for_boards(endpoint: RpcEndpoint) -> int:
    """Registered boards of the class, waiting for the first a little longer than a session
    timeout: after a host crash a board re-registers only once its orphaned session has timed
    out, or, if the session was reset, once its watchdog has started a new server
    (edgetune.fleet.board_rpc_server)."""
    return wait_for_servers(endpoint, SESSION_TIMEOUT_S + 15)


class HeldSession:
    """The board session of one runner worker process, kept across its measurements (the
    RPCRunner's `f_create_session`, `f_upload_module` and `f_cleanup` below use the worker's
    one instance). `opened` dates the session for SESSION_REUSE_S; `generation` counts the
    measurements, so that an idle timer gives the session back only if none started since."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: rpc.RPCSession | None = None
        self.opened = 0.0
        self.generation = 0
        self.uploaded: str | None = None  # the remote file of the measurement in progress
        self.uploads = 0

    def take(self, rpc_config: ms.runner.RPCConfig) -> rpc.RPCSession:
        with self.lock:
            self.generation += 1
            if self.session is not None and (
                time.monotonic() - self.opened > SESSION_REUSE_S or not _answers(self.session)
            ):
                self._give_back()
            if self.session is None:
                endpoint = RpcEndpoint(rpc_config.tracker_host, rpc_config.tracker_port, rpc_config.tracker_key)
                self.session = request_session(endpoint, rpc_config.session_timeout_sec)
                self.opened = time.monotonic()
            return self.session

    def idle(self) -> None:
        """After a measurement: give the board back unless another measurement starts within SESSION_IDLE_S."""
        with self.lock:
            generation = self.generation
        timer = threading.Timer(SESSION_IDLE_S, self._give_back_if_idle, (generation,))
        timer.daemon = True
        timer.start()

    def _give_back_if_idle(self, generation: int) -> None:
        with self.lock:
            if generation == self.generation:
                self._give_back()

    def upload(self, session: rpc.RPCSession, local_path: str) -> tvm.runtime.Module:
        """The candidate uploaded under a name of its own in the session, and loaded."""
        self.uploads += 1
        self.uploaded = own_upload_name(self.uploads, local_path)
        session.upload(local_path, self.uploaded)
        return session.load_module(self.uploaded)

    def clean_up(self, session: rpc.RPCSession | None) -> None:
        """Remove the candidate's file from the board and start the idle timer."""
        try:
            if session is not None and self.uploaded is not None:
                session.remove(self.uploaded)
        finally:
            self.uploaded = None
            self.idle()

    def _give_back(self) -> None:
        """The connection ends, and the board goes back to the tracker, once nothing holds the
        session (the measurement that used it last has returned by now): TVM's sessions have no close()."""
        self.session = None
        gc.collect()


def _answers(session: rpc.RPCSession) -> bool:
    """Whether the board's end of the session still answers (a round trip: looking up a function)."""
    try:
        session.get_function("tvm.rpc.server.workpath")
        return True
    except Exception:  # noqa: BLE001 (a closed socket and a dead server process raise different errors)
        return False


_HELD = HeldSession()


def held_session(rpc_config: ms.runner.RPCConfig) -> rpc.RPCSession:
    """`f_create_session`: the worker's held session, opened through the tracker when it has none."""
    return _HELD.take(rpc_config)


def upload_under_own_name(session: rpc.RPCSession, local_path: str, remote_path: str) -> tvm.runtime.Module:
    """`f_upload_module`: the candidate uploaded under a name of its own in the session. Every
    candidate's file is `candidate.so` (SharedLibraryExport), and a session that has loaded a
    file name would be handed the library already loaded under it (edgetune.tvm_compat.rpc_session)."""
    del remote_path
    return _HELD.upload(session, local_path)


def remove_upload(session: rpc.RPCSession | None, remote_path: str | None) -> None:
    """`f_cleanup`: remove the candidate's file from the board, keep the session's workspace
    (MetaSchedule's cleanup removes the workspace too: the held session could upload no more),
    and start the idle timer."""
    del remote_path
    _HELD.clean_up(session)


def make_runner(
    endpoint: RpcEndpoint,
    boards: int,
    measurement: Measurement,
    index_bounds: Mapping[str, IndexBounds],
) -> ms.runner.RPCRunner:
    """An RPCRunner on the class's `boards` boards with the profile's measurement settings,
    filling the inputs its tasks index with in range (`index_inputs.class_index_bounds`)."""
    runner = ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(
            tracker_host=endpoint.host,
            tracker_port=endpoint.port,
            tracker_key=endpoint.key,
            session_timeout_sec=SESSION_TIMEOUT_S,
        ),
        evaluator_config=ms.runner.EvaluatorConfig(
            number=measurement.number,
            repeat=measurement.repeat,
            min_repeat_ms=measurement.min_repeat_ms,
        ),
        cooldown_sec=measurement.cooldown_ms / 1000.0,
        max_workers=boards,
        initializer=freeze_imports,
        f_create_session=held_session,
        f_upload_module=upload_under_own_name,
        f_alloc_argument=InRangeArguments(index_bounds),
        f_cleanup=remove_upload,
    )
    return collect_after_each_measurement(runner)


@dataclass(frozen=True)
class Measured:
    """One module measured outside the tuning loop: its run_secs, or why it has none."""

    run_secs: list[float] | None
    error: str | None


def build_and_measure(
    mods: Sequence[tvm.IRModule], target: tvm.target.Target, builder: ms.builder.Builder, runner: ms.runner.Runner
) -> list[Measured]:
    """Build modules with the run's builder and measure them in one batch with its runner,
    outside the tuning loop (borrowed schedules, untuned kernels), in order. A module that fails
    to build or run comes back with its error, never raised; the builds' files are removed."""
    built = builder.build([ms.builder.BuilderInput(mod, target) for mod in mods])
    try:
        futures = iter(
            runner.run(
                [
                    ms.runner.RunnerInput(
                        result.artifact_path,
                        device_type=_device_type(target),
                        args_info=ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True),
                    )
                    for mod, result in zip(mods, built)
                    if result.error_msg is None
                ]
            )
        )
        return [_measured(result.error_msg, None if result.error_msg else next(futures).result()) for result in built]
    finally:
        for result in built:  # each candidate has a directory of its own (SharedLibraryExport)
            if result.artifact_path:
                shutil.rmtree(Path(result.artifact_path).parent, ignore_errors=True)


def _measured(build_error: str | None, result: ms.runner.RunnerResult | None) -> Measured:
    if build_error:
        return Measured(None, build_error)
    if result.error_msg or not result.run_secs:
        return Measured(None, result.error_msg or "no timing returned")
    return Measured([float(s) for s in result.run_secs], None)


def _device_type(target: tvm.target.Target) -> str:
    """The device the runner opens on the board ("cpu" for llvm); TVM's runtime does not
    accept the target kind's name ("llvm") as a device any more."""
    return tvm.runtime.device(target.get_target_device_type()).type
