"""Which tests share a pytest-xdist worker under `make test` (`-n 3 --dist loadgroup`): every
user of the session's simulated fleet (`SESSION_FLEET_FIXTURES`) on one worker, so the fleet
is built and tuned once, and each other module whole on one worker, so its module fixtures run once.

pytest-xdist's own `loadgroup` cannot do this with pytest 9: it marks a group by rewriting
`item._nodeid`, which pytest 9 no longer reads, so every test went its own way (known upstream:
pytest-dev/pytest-xdist#1386, open, fix proposed in #1388). Here each worker
writes the group of every test it collected to a directory the controller names, and the
controller's scheduler (`GroupScheduling`) takes the groups from there; xdist's scheduler for
whole scopes does the rest. It hands out the groups heaviest first, by their tests' markers (a
`fleet` test takes seconds to minutes, a `tvm` one seconds, the rest less), not by their number
of tests as xdist does: a module of one long fleet test handed out last keeps one worker busy for
minutes while the other has nothing left to do.

A fleet test spends much of its time waiting (for a board's quota-limited CPU, a timeout, a
board coming back), so with three or more workers the last is a background worker: it runs at
niceness `BACKGROUND_NICE` and takes only the groups that start no fleet, compiling while the
fleet tests wait, and yielding the cores to them when they do not.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from support.quiet_host import name_locks_dir

SESSION_FLEET_FIXTURES = {"sim_fleet"}  # session-scoped: each worker would build its own
SESSION_FLEET_GROUP = "session-fleet"
MARKER_WEIGHTS = {"fleet": 100, "tvm": 20}  # a test's weight by its heaviest marker; 1 without
BACKGROUND_NICE = 19  # the lowest priority: a nice-0 process gets about 70x its CPU share
_DIRECTORY_KEY = "edgetune_groups_dir"
_BACKGROUND_KEY = "edgetune_background_worker"


def group_of(item: pytest.Item) -> str:
    return SESSION_FLEET_GROUP if SESSION_FLEET_FIXTURES & set(item.fixturenames) else item.nodeid.split("::")[0]


def weight_of(item: pytest.Item) -> int:
    return max((w for marker, w in MARKER_WEIGHTS.items() if item.get_closest_marker(marker)), default=1)


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: write each collected test's group, and each group's weight, for the
    controller."""
    directory = getattr(config, "workerinput", {}).get(_DIRECTORY_KEY)
    if directory:
        groups = {item.nodeid: group_of(item) for item in items}
        weights: dict[str, int] = {}
        for item in items:
            weights[groups[item.nodeid]] = weights.get(groups[item.nodeid], 0) + weight_of(item)
        fleet_groups = sorted({groups[item.nodeid] for item in items if item.get_closest_marker("fleet")})
        recorded = {"groups": groups, "weights": weights, "fleet_groups": fleet_groups}
        (Path(directory) / f"{config.workerinput['workerid']}.json").write_text(json.dumps(recorded))


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
    """In an xdist worker: lower its priority if it is the background worker."""
    if getattr(config, "workerinput", {}).get(_BACKGROUND_KEY):
        os.nice(BACKGROUND_NICE)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Whole groups to a worker, the groups as the workers recorded them, heaviest first; to
        the background worker only groups that start no fleet."""

        recorded: dict | None = None
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self.recorded is None:  # called once every worker has collected
                files = sorted(Path(config._edgetune_groups_dir).glob("*.json"))
                self.recorded = (
                    json.loads(files[0].read_text()) if files else {"groups": {}, "weights": {}, "fleet_groups": []}
                )
            return self.recorded["groups"].get(nodeid, nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the queue is complete, in xdist's order
                weights = self.recorded["weights"] if self.recorded else {}
                for scope in sorted(self.workqueue, key=lambda scope: -weights.get(scope, 0)):
                    self.workqueue.move_to_end(scope)
                self.ordered = True
            if node.workerinput.get(_BACKGROUND_KEY):
                scope = self._first_without_fleet()
                if scope is None:
                    self._retire(node)
                    return
                self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if node.workerinput.get(_BACKGROUND_KEY) and self._first_without_fleet() is None:
                self._retire(node)
                return
            super()._reschedule(node)

        def _first_without_fleet(self) -> str | None:
            fleet_groups = set(self.recorded["fleet_groups"]) if self.recorded else set()
            return next((scope for scope in self.workqueue if scope not in fleet_groups), None)

        @staticmethod
        def _retire(node) -> None:
            """No group left for the background worker: it ends after the tests it has, the
            others take the fleet groups left."""
            if not node.shutting_down:
                node.shutdown()

    return GroupScheduling(config, log)
