"""Which tests share a pytest-xdist worker under `make test` (`-n 2 --dist loadgroup`): every
user of the session's simulated fleet (`SESSION_FLEET_FIXTURES`) on one worker, so the fleet
is built and tuned once, and each other module whole on either, so its module fixtures run once.

pytest-xdist's own `loadgroup` cannot do this with pytest 9: it marks a group by rewriting
`item._nodeid`, which pytest 9 no longer reads, so every test went its own way (known upstream:
pytest-dev/pytest-xdist#1386, open, fix proposed in #1388). Here each worker
writes the group of every test it collected to a directory the controller names, and the
controller's scheduler (`GroupScheduling`) takes the groups from there; xdist's scheduler for
whole scopes does the rest (largest group first).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from quiet_host import name_locks_dir

SESSION_FLEET_FIXTURES = {"sim_fleet"}  # session-scoped: each worker would build its own
SESSION_FLEET_GROUP = "session-fleet"
_DIRECTORY_KEY = "edgetune_groups_dir"


def group_of(item: pytest.Item) -> str:
    return SESSION_FLEET_GROUP if SESSION_FLEET_FIXTURES & set(item.fixturenames) else item.nodeid.split("::")[0]


def record_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: write each collected test's group for the controller."""
    directory = getattr(config, "workerinput", {}).get(_DIRECTORY_KEY)
    if directory:
        groups = {item.nodeid: group_of(item) for item in items}
        (Path(directory) / f"{config.workerinput['workerid']}.json").write_text(json.dumps(groups))


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
        """Whole groups to a worker, the groups as the workers recorded them."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # called once every worker has collected
                recorded = sorted(Path(config._edgetune_groups_dir).glob("*.json"))
                self.groups = json.loads(recorded[0].read_text()) if recorded else {}
            return self.groups.get(nodeid, nodeid.split("::")[0])

    return GroupScheduling(config, log)
