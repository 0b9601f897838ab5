"""Read-only views of a running fleet: per-board status (with its role: a board of its class's
tuning pool, registered with the tracker, or a target that only runs releases) and per-tracker
queues. Nothing here starts or stops anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from edgetune.errors import EdgetuneError
from edgetune.fleet import on_board
from edgetune.fleet.journal import record_event
from edgetune.fleet.parallel import for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.ssh_route import rpc_address
from edgetune.fleet.state import BoardRecord, FleetState, load_deployed, load_fleet_state, load_reported
from edgetune.fleet.tracker import TrackerSummary, query_tracker, tracker_alive
from edgetune.inventory.schema import POOL, Board, Fleet


@dataclass(frozen=True)
class BoardStatus:
    name: str
    device_class: str
    role: str  # POOL: it tunes and measures its class's builds (it has an rpc_server); TARGET: it only runs releases
    address: str
    reachable: bool
    registered: bool  # listed by its tracker under its class key
    server_running: bool | None  # the recorded rpc_server process; None: unknown
    python_version: str | None
    tvm_version: str | None
    firmware: str | None
    firmware_changed: bool  # differs from the fingerprint recorded at `fleet up`
    error: str | None
    deployed: dict[str, int | str] = field(default_factory=dict)  # model -> artifact version it runs, or "unknown"
    reported: str | None = None  # when its pull timer last reported to the server (UTC ISO 8601); None: never
    pull_errors: dict[str, str] = field(default_factory=dict)  # model -> why its last pull did not install it

    @property
    def healthy(self) -> bool:
        """Reachable and without error, and registered if it is a pool board."""
        return self.reachable and (self.registered or self.role != POOL) and not self.error


@dataclass(frozen=True)
class ClassStatus:
    tracker: str
    address: str
    device_class: str
    registered: int
    free: int
    busy: int
    pending: int


def fleet_status(fleet: Fleet) -> list[BoardStatus]:
    """Every board, in inventory order: its role, reachable over SSH, registered, versions, firmware."""
    state = load_fleet_state(fleet)
    summaries = _summaries(state)
    deployed, reported = load_deployed(fleet), load_reported(fleet)

    def status(board: Board) -> BoardStatus:
        summary = summaries.get(board.tracker)
        registered = summary is not None and summary.registered(board.device_class, rpc_address(board))
        found = _board_status(fleet, board, state.boards.get(board.name), registered)
        report = reported.get(board.name)
        return replace(
            found,
            deployed=deployed.get(board.name, {}),
            reported=report.received if report else None,
            pull_errors=dict(report.errors) if report else {},
        )

    result = for_each_board(fleet.boards, status)
    found = [result.succeeded[board.name] for board in fleet.boards]
    record_event(fleet, "status", boards=[asdict(board) for board in found])
    return found


def tracker_status(fleet: Fleet) -> list[ClassStatus]:
    """Per tracker and device class: servers registered, free, busy, requests pending."""
    state = load_fleet_state(fleet)
    rows = []
    for name, summary in sorted(_summaries(state).items()):
        for device_class in sorted({b.device_class for b in fleet.boards if b.tracker == name}):
            load = summary.load(device_class)
            rows.append(
                ClassStatus(
                    name,
                    state.trackers[name].address,
                    device_class,
                    load.registered,
                    load.free,
                    load.busy,
                    load.pending,
                )
            )
    return rows


def _summaries(state: FleetState) -> dict[str, TrackerSummary]:
    """The live trackers' summaries; a dead tracker has none (so nothing is registered)."""
    return {name: query_tracker(record) for name, record in state.trackers.items() if tracker_alive(record)}


def _board_status(fleet: Fleet, board: Board, record: BoardRecord | None, registered: bool) -> BoardStatus:
    """Never raises: an error becomes the status's `error` (and `reachable` says whether SSH got in)."""
    status = BoardStatus(
        board.name,
        board.device_class,
        fleet.role(board),
        board.address,
        reachable=False,
        registered=registered,
        server_running=None,
        python_version=None,
        tvm_version=None,
        firmware=None,
        firmware_changed=False,
        error=None,
    )
    with BoardSession(board) as session:
        try:
            session.connect()
        except EdgetuneError as err:
            return replace(status, error=str(err))
        try:
            facts = on_board.probe(session, fleet, preflight=False)
            running = on_board.server_running(session, record.pid) if record else False
        except EdgetuneError as err:
            return replace(status, reachable=True, error=str(err))
    return replace(
        status,
        reachable=True,
        server_running=running,
        python_version=facts.python_version,
        tvm_version=facts.tvm_version,
        firmware=facts.firmware,
        firmware_changed=record is not None and record.firmware != facts.firmware,
        error=facts.tvm_error,
    )
