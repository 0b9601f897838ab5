"""Measurement on a device class's boards: MetaSchedule's RPCRunner through the fleet tracker.

Boards of a class register with the tracker under the class name as key, so the tracker hands
each measurement to a free board of that class; as many measurements run at once as the class
has boards. A board that dies mid-measurement turns that candidate into a failed RunnerResult
(TVM's RPCRunner catches the broken session) and the tracker stops handing it out.
Inputs that a kernel indexes with are filled in range (`index_inputs.InRangeArguments`), so a
gather or an embedding lookup is measured instead of crashing the board's session.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping

from tvm import rpc
from tvm.s_tir import meta_schedule as ms

from edgetune.fleet.tracker import RpcEndpoint, wait_for_servers
from edgetune.inventory.schema import Measurement
from edgetune.tune.index_inputs import IndexBounds, InRangeArguments

SESSION_TIMEOUT_S = 60


def wait_for_boards(endpoint: RpcEndpoint) -> int:
    """Registered boards of the class, waiting for the first a little longer than a session
    timeout: after a host crash a board re-registers only once its orphaned session has timed
    out, or, if the session was reset, once its watchdog has started a new server
    (edgetune.fleet.board_rpc_server)."""
    return wait_for_servers(endpoint, SESSION_TIMEOUT_S + 15)


def freeze_imports() -> None:
    """A measurement worker's initializer: what it has imported so far is never garbage, so
    `create_session`'s collection skips it (50 ms a collection here, microseconds frozen)."""
    gc.freeze()


def create_session(rpc_config: ms.runner.RPCConfig) -> rpc.RPCSession:
    """MetaSchedule's session from the tracker, asked for only once the worker's earlier sessions
    are collected: a finished session can stay alive in a reference cycle until the garbage
    collector runs, holding its board all the while. With the class's other board dead, the
    worker then waited on the tracker for the very board its finished session held, until the board
    timed that session out (SESSION_TIMEOUT_S; 5 of 6 such runs here)."""
    gc.collect()
    return rpc_config.connect_server()


def make_runner(
    endpoint: RpcEndpoint, boards: int, measurement: Measurement, index_bounds: Mapping[str, IndexBounds],
) -> ms.runner.RPCRunner:
    """An RPCRunner on the class's `boards` boards with the profile's measurement settings,
    filling the inputs its tasks index with in range (`index_inputs.class_index_bounds`)."""
    return ms.runner.RPCRunner(
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
        f_create_session=create_session,
        f_alloc_argument=InRangeArguments(index_bounds),
    )
