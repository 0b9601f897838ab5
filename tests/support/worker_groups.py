"""Which tests share a pytest-xdist worker under `make test` (`-n 3 --dist loadgroup`): every
user of the session's simulated fleet (`SESSION_FLEET_FIXTURES`) on one worker, so the fleet
is built and tuned once, and each other module whole on one worker, so its module fixtures run once.

pytest-xdist's own `loadgroup` cannot do this with pytest 9: it marks a group by rewriting
`item._nodeid`, which pytest 9 no longer reads, so every test went its own way (known upstream:
pytest-dev/pytest-xdist#1386, open, fix proposed in #1388). Here each worker
writes the group of every test it collected to a directory the controller names, and the
controller's scheduler (`GroupScheduling`) takes the groups from there; xdist's scheduler for
whole scopes does the rest. It hands out the longest groups first, not the ones of most tests as
xdist does: a module of one long fleet test handed out last keeps one worker busy for a minute
while the others have nothing left to do. A group's length is its seconds in tests/durations.json
(written by `make test-durations`, the run's own time of each group); a group not there yet is
weighed by its tests' markers (a `fleet` test about 10 s, a `tvm` one 2 s, the rest a twentieth).

A fleet test spends much of its time waiting (for a board's quota-limited CPU, a timeout, a
board coming back), so with three or more workers the last is a background worker: it runs at
the lowest priority (tests/support/worker_priority.py) and takes the groups that start no
fleet, compiling while the fleet tests wait, and yielding the cores to them when they do not.
Once none is left, it takes the shortest fleet groups, from the end of the queue, back at
normal priority (as root, who may raise a priority again).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from support.quiet_host import name_locks_dir
from support.worker_priority import can_return_to_normal, lower_to_background

SESSION_FLEET_FIXTURES = {"sim_fleet"}  # session-scoped: each worker would build its own
SESSION_FLEET_GROUP = "session-fleet"
DURATIONS_FILE = Path(__file__).resolve().parents[1] / "durations.json"
MARKER_SECONDS = {"fleet": 10.0, "tvm": 2.0}  # a test's length by its heaviest marker, unmeasured
UNMARKED_SECONDS = 0.05
_DIRECTORY_KEY = "edgetune_groups_dir"
_BACKGROUND_KEY = "edgetune_background_worker"


def group_of(item: pytest.Item) -> str:
    return SESSION_FLEET_GROUP if SESSION_FLEET_FIXTURES & set(item.fixturenames) else item.nodeid.split("::")[0]


def marker_seconds(item: pytest.Item) -> float:
    return max((s for marker, s in MARKER_SECONDS.items() if item.get_closest_marker(marker)), default=UNMARKED_SECONDS)


def measured_seconds() -> dict[str, float]:
    """tests/durations.json: each group's seconds in the run that wrote it; {} without the file."""
    try:
        return json.loads(DURATIONS_FILE.read_text())
    except FileNotFoundError:
        return {}


def group_seconds(items: list[pytest.Item], groups: dict[str, str]) -> dict[str, float]:
    """Each group's expected length: as measured, or as its tests' markers say."""
    measured, estimated = measured_seconds(), {}
    for item in items:
        group = groups[item.nodeid]
        estimated[group] = estimated.get(group, 0.0) + marker_seconds(item)
    return {group: measured.get(group, seconds) for group, seconds in estimated.items()}


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: write each collected test's group, and each group's expected length,
    for the controller."""
    directory = getattr(config, "workerinput", {}).get(_DIRECTORY_KEY)
    if directory:
        groups = {item.nodeid: group_of(item) for item in items}
        weights = group_seconds(items, groups)
        fleet_groups = sorted({groups[item.nodeid] for item in items if item.get_closest_marker("fleet")})
        recorded = {"groups": groups, "weights": weights, "fleet_groups": fleet_groups}
        (Path(directory) / f"{config.workerinput['workerid']}.json").write_text(json.dumps(recorded))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each group's seconds in this run to {DURATIONS_FILE.name} (run the whole suite)",
    )


class DurationRecorder:
    """In the controller under `--store-durations`: each test's setup, call and teardown
    seconds, summed by group into tests/durations.json when a run that was not interrupted ends."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == pytest.ExitCode.INTERRUPTED or not self.seconds:
            return
        groups = {item.nodeid: group_of(item) for item in session.items} or _recorded(self.config)["groups"]
        totals: dict[str, float] = {}
        for nodeid, seconds in self.seconds.items():
            group = groups.get(nodeid, nodeid.split("::")[0])
            totals[group] = totals.get(group, 0.0) + seconds
        DURATIONS_FILE.write_text(json.dumps({g: round(s, 1) for g, s in sorted(totals.items())}, indent=0) + "\n")


def record_durations(config: pytest.Config) -> None:
    """In the controller (or a run without xdist): record the groups' seconds if asked to."""
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(config), "edgetune-durations")


def _recorded(config: pytest.Config) -> dict:
    """What the workers recorded (`record_groups`): the first worker's file, all alike."""
    files = sorted(Path(getattr(config, "_edgetune_groups_dir", "/nonexistent")).glob("*.json"))
    return json.loads(files[0].read_text()) if files else {"groups": {}, "weights": {}, "fleet_groups": []}


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """In the controller, for each worker it starts: where to write the groups."""
    config = node.config
    if not hasattr(config, "_edgetune_groups_dir"):
        config._edgetune_groups_dir = tempfile.mkdtemp(prefix="edgetune-xdist-groups-")
        config.add_cleanup(lambda: shutil.rmtree(config._edgetune_groups_dir, ignore_errors=True))
    node.workerinput[_DIRECTORY_KEY] = config._edgetune_groups_dir
    workers = len(config.getvalue("tx") or ())
    node.workerinput[_BACKGROUND_KEY] = workers >= 3 and node.workerinput["workerid"] == f"gw{workers - 1}"
    name_locks_dir(node, config._edgetune_groups_dir)


def nice_background_worker(config: pytest.Config) -> None:
    """In an xdist worker: lower its priority if it is the background worker (back to normal
    for a fleet test: tests/support/worker_priority.py)."""
    if getattr(config, "workerinput", {}).get(_BACKGROUND_KEY):
        lower_to_background()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Whole groups to a worker, the groups as the workers recorded them, longest first; to
        the background worker the groups that start no fleet, then the shortest fleet groups."""

        recorded: dict | None = None
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self.recorded is None:  # called once every worker has collected
                self.recorded = _recorded(config)
            return self.recorded["groups"].get(nodeid, nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the queue is complete, in xdist's order
                weights = self.recorded["weights"] if self.recorded else {}
                for scope in sorted(self.workqueue, key=lambda scope: -weights.get(scope, 0)):
                    self.workqueue.move_to_end(scope)
                self.ordered = True
            if node.workerinput.get(_BACKGROUND_KEY):
                scope = self._background_scope()
                if scope is None:
                    self._retire(node)
                    return
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if node.workerinput.get(_BACKGROUND_KEY) and self._background_scope() is None:
                self._retire(node)
                return
            super()._reschedule(node)

        def _background_scope(self) -> str | None:
            """The longest group left that starts no fleet; else the shortest fleet group."""
            fleet_groups = set(self.recorded["fleet_groups"]) if self.recorded else set()
            without_fleet = next((scope for scope in self.workqueue if scope not in fleet_groups), None)
            if without_fleet is None and self.workqueue and can_return_to_normal():
                return next(reversed(self.workqueue))
            return without_fleet

        @staticmethod
        def _retire(node) -> None:
            """No group left for the background worker: it ends after the tests it has, the
            others take the fleet groups left."""
            if not node.shutting_down:
                node.shutdown()

    return GroupScheduling(config, log)
