"""Bring a fleet online and take it down: trackers on the host, an rpc_server per board of a
class's tuning pool, and for such a board of the SSH transport its keeper on the host
(fleet/tunnel.py).

`fleet_up` is idempotent: it starts a tracker only if its recorded one is dead, an rpc_server
only where the recorded one is dead or not registered, and uploads the agent's bundle only
where the board's copy differs (fleet/agent_bundle.py); then it waits until every
pool board is registered under its class key, reporting boards as they come online. A board
outside its class's tuning pool (a target: it only runs releases) is left alone: no preflight,
bundle, keeper or rpc_server (a rollout delivers the bundle itself and needs no keeper), and an
rpc_server recorded for it from when it was in the pool is stopped, so that the tracker hands
out pool boards only. Every board is handled in parallel and reported on its own
(`GroupResult`); state goes to fleet.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import tvm

from edgetune.errors import EdgetuneError, FleetError
from edgetune.fleet import on_board
from edgetune.fleet.agent_bundle import ensure_bundle
from edgetune.fleet.parallel import GroupResult, for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import rpc_address, uses_ssh_transport
from edgetune.fleet.state import (
    BoardRecord,
    FleetState,
    TrackerRecord,
    TunnelRecord,
    load_fleet_state,
    save_fleet_state,
)
from edgetune.fleet.tracker import TrackerSummary, query_tracker, start_tracker, stop_tracker, tracker_alive
from edgetune.fleet.tunnel import start_tunnel, stop_tunnel, tunnel_alive
from edgetune.inventory.schema import Board, Fleet
from edgetune.inventory.workdir import Workdir

REGISTER_TIMEOUT_S = 60.0
REGISTER_POLL_S = 0.5

log = logging.getLogger(__name__)


def fleet_up(fleet: Fleet, register_timeout_s: float = REGISTER_TIMEOUT_S) -> GroupResult[BoardRecord]:
    """Start what is missing (trackers, rpc_servers of the tuning pools' boards) and wait until
    every pool board is registered; stop what is recorded on a board outside its pool. The
    trackers start while the boards are checked and get their bundles, which needs no tracker."""
    pool = [board for board in fleet.boards if fleet.in_pool(board)]
    state = load_fleet_state(fleet)
    clashes = _address_clashes(pool)
    with ThreadPoolExecutor(max_workers=1) as background:
        hosted = background.submit(_trackers_up, fleet, state)
        retired = _retire_targets(fleet, state)

        def bring_up(board: Board) -> tuple[BoardRecord, bool]:
            if board.name in clashes:
                raise FleetError(clashes[board.name])

            def tracker() -> tuple[TrackerRecord, TrackerSummary]:
                trackers, summaries = hosted.result()
                return trackers[board.tracker], summaries[board.tracker]

            return _bring_up(fleet, board, tracker, state.boards.get(board.name))

        started = for_each_board(pool, bring_up)
        trackers, _ = hosted.result()
    running = {name: record for name, (record, _) in started.succeeded.items()}
    kept = {name: record for name, record in state.boards.items() if name not in retired.succeeded}
    save_fleet_state(fleet, FleetState(trackers, {**kept, **running}))
    online = _await_registration(fleet, trackers, started, register_timeout_s)
    return GroupResult(online.succeeded, {**online.failed, **retired.failed})


def _trackers_up(fleet: Fleet, state: FleetState) -> tuple[dict[str, TrackerRecord], dict[str, TrackerSummary]]:
    """Each tracker's record (started where the recorded one is dead, and recorded at once) and
    what it lists now."""
    trackers = _ensure_trackers(fleet, state)
    save_fleet_state(fleet, FleetState(trackers, state.boards))
    return trackers, {name: query_tracker(record) for name, record in trackers.items()}


def _retire_targets(fleet: Fleet, state: FleetState) -> GroupResult[bool]:
    """Log each board outside its class's tuning pool, and stop the rpc_server (and keeper)
    recorded for it: registered, it would be handed out for tuning and builds."""
    targets = [board for board in fleet.boards if not fleet.in_pool(board)]
    for board in targets:
        log.info(f"{board.name}: a target of class {board.device_class}, outside its tuning pool: no rpc_server")
    recorded = [board for board in targets if board.name in state.boards]
    retired = for_each_board(recorded, lambda board: _stop_board(board, state.boards[board.name]))
    for name, stopped in retired.succeeded.items():
        log.info(f"{name}: rpc_server {'stopped' if stopped else 'was not running'} (outside its tuning pool)")
    return retired


def fleet_down(fleet: Fleet) -> GroupResult[bool]:
    """Stop every recorded rpc_server (over SSH), then the trackers. Safe to run twice: what
    is not running is skipped; a board that cannot be reached keeps its record for next time."""
    state = load_fleet_state(fleet)
    recorded = [board for board in fleet.boards if board.name in state.boards]
    result = for_each_board(recorded, lambda board: _stop_board(board, state.boards[board.name]))
    for name, stopped in result.succeeded.items():
        log.info(f"{name}: rpc_server {'stopped' if stopped else 'was not running'}")
    for record in state.trackers.values():
        stopped = stop_tracker(record)
        log.info(f"tracker {record.name} at {record.address}: {'stopped' if stopped else 'was not running'}")
    save_fleet_state(fleet, FleetState({}, {name: state.boards[name] for name in result.failed}))
    return result


def _address_clashes(boards: list[Board]) -> dict[str, str]:
    """Boards the tracker would list under one address (`rpc_address`), each with why it is refused."""
    by_address: dict[str, list[str]] = {}
    for board in boards:
        by_address.setdefault(rpc_address(board), []).append(board.name)
    return {
        name: f"{name}: the tracker would list it under {address} as it would {', '.join(n for n in names if n != name)} "
        "(boards of the SSH transport whose addresses differ only in the first number); give one of them "
        "`ssh: {transport: direct}`"
        for address, names in by_address.items()
        if len(names) > 1
        for name in names
    }


def _ensure_trackers(fleet: Fleet, state: FleetState) -> dict[str, TrackerRecord]:
    records = {}
    for tracker in (fleet.tracker(name) for name in sorted({board.tracker for board in fleet.boards})):
        record = state.trackers.get(tracker.name)
        if not tracker_alive(record):
            record = start_tracker(tracker, Workdir(fleet.workdir).logs)
            log.info(f"tracker {tracker.name} started at {record.address} (pid {record.pid})")
        records[tracker.name] = record
    return records


def _bring_up(
    fleet: Fleet,
    board: Board,
    tracker_of: Callable[[], tuple[TrackerRecord, TrackerSummary]],
    previous: BoardRecord | None,
) -> tuple[BoardRecord, bool]:
    """Preflight the board, deliver the agent's bundle where the board's copy differs, then, once
    its tracker is up (`tracker_of`), start its rpc_server (behind its SSH transport's keeper
    where it has one) unless the recorded one is fine. Returns the board's record and whether a
    server was started."""
    profile = fleet.device_class(board.device_class).profile
    tunnelled = uses_ssh_transport(board)
    with BoardSession(board) as session:
        facts = on_board.probe(session, fleet, preflight=True)
        on_board.check_ready(board, facts, tvm.__version__, profile.target)
        advice = on_board.datapath_advice(board, profile.target, facts)
        if advice:
            log.warning(advice)
        ensure_bundle(session)
        tracker, summary = tracker_of()
        if _still_serving(session, tracker, summary, previous, tunnelled):
            pid, place, tunnel = previous.pid, None, previous.tunnel
        else:
            if previous is not None:
                on_board.stop_server(session, previous.pid)
                stop_tunnel(previous.tunnel)
            on_board.stop_leftover_server(session)
            pid, place, tunnel = _start(fleet, session, tracker, board.threads or profile.runtime_threads, tunnelled)
    address = previous.rpc_address if place is None else place.custom_addr
    record = BoardRecord(
        pid,
        tracker.address,
        board.device_class,
        facts.python_version,
        facts.tvm_version,
        facts.firmware,
        address,
        tunnel,
    )
    return record, place is not None


def _still_serving(
    session: BoardSession,
    tracker: TrackerRecord,
    summary: TrackerSummary,
    previous: BoardRecord | None,
    tunnelled: bool,
) -> bool:
    """Whether the recorded rpc_server is registered, runs, and has the transport asked for."""
    return (
        previous is not None
        and previous.tracker == tracker.address
        and previous.rpc_address == rpc_address(session.board)
        and summary.registered(session.board.device_class, previous.rpc_address)
        and (tunnel_alive(previous.tunnel) if tunnelled else previous.tunnel is None)
        and on_board.server_running(session, previous.pid)
    )


def _start(
    fleet: Fleet, session: BoardSession, tracker: TrackerRecord, threads: int, tunnelled: bool
) -> tuple[int, on_board.ServerPlace, TunnelRecord | None]:
    """Start the board's rpc_server, and first its SSH transport's keeper where it has one."""
    board = session.board
    if not tunnelled:
        place = on_board.direct_place(board, tracker)
        return on_board.start_server(session, place, board.device_class, threads, tunnelled), place, None
    tunnel = start_tunnel(fleet, board, tracker, on_board.free_loopback_port(session))
    place = on_board.tunnelled_place(tunnel)
    try:
        return on_board.start_server(session, place, board.device_class, threads, tunnelled), place, tunnel
    except BaseException:
        stop_tunnel(tunnel)
        raise


def _await_registration(
    fleet: Fleet,
    trackers: dict[str, TrackerRecord],
    started: GroupResult[tuple[BoardRecord, bool]],
    timeout_s: float,
) -> GroupResult[BoardRecord]:
    """Poll the trackers until every started board is registered under its class key."""
    waiting = {name for name, (_, fresh) in started.succeeded.items() if fresh}
    for name in sorted(set(started.succeeded) - waiting):
        log.info(f"{name}: already online")
    for reason in started.failed.values():
        log.info(f"FAILED: {reason}")
    total, online = len(started.succeeded) + len(started.failed), len(started.succeeded) - len(waiting)
    deadline = time.monotonic() + timeout_s
    while waiting:
        summaries = {name: query_tracker(record) for name, record in trackers.items()}
        for name in sorted(waiting):
            board, address = fleet.board(name), started.succeeded[name][0].rpc_address
            if summaries[board.tracker].registered(board.device_class, address):
                waiting.discard(name)
                online += 1
                log.info(f"{name}: online as {board.device_class} at {address} ({online}/{total})")
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(REGISTER_POLL_S)
    failed = dict(started.failed)
    for name in waiting:
        failed[name] = _not_registered(fleet.board(name), started.succeeded[name][0], timeout_s)
        log.info(f"FAILED: {failed[name]}")
    succeeded = {name: record for name, (record, _) in started.succeeded.items() if name not in failed}
    return GroupResult(succeeded, failed)


def _not_registered(board: Board, record: BoardRecord, timeout_s: float) -> str:
    try:
        with BoardSession(board) as session:
            log_tail = on_board.server_log_tail(session)
    except EdgetuneError as err:
        log_tail = f"(cannot read it: {err})"
    return (
        f"{board.name}: rpc_server (pid {record.pid}) did not register with tracker {record.tracker} "
        f"within {timeout_s:g} s; {board.workdir}/{on_board.RPC_SERVER_LOG} ends with:\n{log_tail}"
    )


def _stop_board(board: Board, record: BoardRecord) -> bool:
    """Stop the board's rpc_server, then its keeper (whether the board answered or not)."""
    try:
        with BoardSession(board) as session:
            return on_board.stop_server(session, record.pid)
    finally:
        stop_tunnel(record.tunnel)
