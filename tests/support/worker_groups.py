"""Which tests share a pytest-xdist worker under `make test` (`-n 2 --dist loadgroup`): every
user of the session's simulated fleet (`SESSION_FLEET_FIXTURES`) on one worker, so the fleet
is built and tuned once, and each other module whole on either, so its module fixtures run once.

pytest-xdist's own `loadgroup` cannot do this with pytest 9: it marks a group by rewriting
`item._nodeid`, which pytest 9 no longer reads, so every test went its own way (known upstream:
pytest-dev/pytest-xdist#1386, open, fix proposed in #1388). Here each worker
writes the group of every test it collected to a directory the controller names, and the
controller's scheduler (`GroupScheduling`) takes the groups from there; xdist's scheduler for
whole scopes does the rest. It hands out the groups heaviest first, by their tests' markers (a
`fleet` test takes seconds to minutes, a `tvm` one seconds, the rest less), not by their number
of tests as xdist does: a module of one long fleet test handed out last keeps one worker busy for
minutes while the other has nothing left to do.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from support.quiet_host import name_locks_dir

SESSION_FLEET_FIXTURES = {"sim_fleet"}  # session-scoped: each worker would build its own
SESSION_FLEET_GROUP = "session-fleet"
MARKER_WEIGHTS = {"fleet": 100, "tvm": 20}  # a test's weight by its heaviest marker; 1 without
_DIRECTORY_KEY = "edgetune_groups_dir"


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
        recorded = {"groups": groups, "weights": weights}
        (Path(directory) / f"{config.workerinput['workerid']}.json").write_text(json.dumps(recorded))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """In the controller, for each worker it starts: where to write the groups."""
    config = node.config
    if not hasattr(config, "_edgetune_groups_dir"):
        config._edgetune_groups_dir = tempfile.mkdtemp(prefix="edgetune-xdist-groups-")
        config.add_cleanup(lambda: shutil.rmtree(config._edgetune_groups_dir, ignore_errors=True))
    node.workerinput[_DIRECTORY_KEY] = config._edgetune_groups_dir
    name_locks_dir(node, config._edgetune_groups_dir)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Whole groups to a worker, the groups as the workers recorded them, heaviest first."""

        recorded: dict | None = None
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self.recorded is None:  # called once every worker has collected
                files = sorted(Path(config._edgetune_groups_dir).glob("*.json"))
                self.recorded = json.loads(files[0].read_text()) if files else {"groups": {}, "weights": {}}
            return self.recorded["groups"].get(nodeid, nodeid.split("::")[0])

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the queue is complete, in xdist's order
                weights = self.recorded["weights"] if self.recorded else {}
                for scope in sorted(self.workqueue, key=lambda scope: -weights.get(scope, 0)):
                    self.workqueue.move_to_end(scope)
                self.ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
