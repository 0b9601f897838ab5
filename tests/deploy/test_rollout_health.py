"""A model's health gate in a rollout, on the simulated fleet: the application on each gw-fast
board (a file its `on_switch` writes: the version it uses) follows the rollout; on the board
whose health command fails, the agent switches back, the application is back on the previous
version, the rollout reports that board failed with the health command's output, and
deployed.json (what `fleet status` shows) and the rollout's record agree with the boards.

Uses `released_fleet` (tests/conftest.py) and the real server, with a model of its own
(`mlp-health`: copies of the built mlp). Simulated boards share this machine's files, so the
"application" is a folder of this test."""

from __future__ import annotations

import dataclasses
import json

import pytest
from support.deploy_support import publish_copy, served_on_v1

from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.rollout import plan_rollout, rollout
from edgetune.fleet.journal import journal_path
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import load_deployed
from edgetune.inventory.schema import HealthCheck

MODEL = "mlp-health"
FAST = ["gw-fast"]
ON_SWITCH = 'echo "$EDGETUNE_VERSION" > {app}/$EDGETUNE_BOARD.version'
HEALTH = 'echo "asking the app on $EDGETUNE_BOARD (v$EDGETUNE_VERSION)"; if [ -e {app}/$EDGETUNE_BOARD.broken ]; then cat {app}/$EDGETUNE_BOARD.broken; exit 1; fi'


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    return tmp_path_factory.mktemp("app")


@pytest.fixture(scope="module")
def fleet(released_fleet, app):
    """released_fleet with MODEL declared with hooks, served, and its v1 on the gw-fast boards."""
    mlp = next(m for m in released_fleet.models if m.name == "mlp")
    health = HealthCheck(HEALTH.format(app=app), timeout_s=20)
    model = dataclasses.replace(mlp, name=MODEL, on_switch=ON_SWITCH.format(app=app), health=health)
    fleet = released_fleet.replace(models=(*released_fleet.models, model))
    with served_on_v1(fleet, MODEL, "gw-fast"):
        yield fleet


def runs(fleet, name: str) -> int | None:
    with BoardSession(fleet.board(name)) as session:
        return RemoteAgent(session, fleet).call("status")["models"][MODEL]["version"]


def test_a_board_whose_health_check_fails_goes_back_and_is_reported_failed_with_its_output(fleet, app):
    assert {name: (app / f"{name}.version").read_text() for name in ("fast-1", "fast-2")} == {
        "fast-1": "1\n",
        "fast-2": "1\n",
    }
    v2 = publish_copy(fleet, MODEL, "gw-fast", "v2").version
    (app / "fast-2.broken").write_text("the app on fast-2 answers 503 with this model\n")
    result = rollout(fleet, plan_rollout(fleet, MODEL, classes=FAST, canary=0, max_failed_pct=50))
    records = {record["board"]: record for record in result.records()}
    fast_1, fast_2 = records["fast-1"], records["fast-2"]
    assert result.stopped is None and not result.ok  # one of two boards may fail: the rollout goes on
    assert (fast_1["result"], fast_1["runs"], fast_1["error"]) == ("installed", v2, None)
    assert [(run["hook"], run["outcome"]) for run in fast_1["hooks"]] == [("on_switch", "passed"), ("health", "passed")]
    assert (fast_2["result"], fast_2["from_version"], fast_2["to_version"], fast_2["runs"]) == ("failed", 1, v2, 1)
    assert fast_2["error"].startswith(f"the health check failed after the switch to v{v2}: ")
    assert fast_2["error"].endswith(
        f"exited 1; its output (last lines):\nasking the app on fast-2 (v{v2})\n"
        "the app on fast-2 answers 503 with this model; switched back to v1"
    )
    assert [(run["hook"], run["outcome"], run["version"]) for run in fast_2["hooks"]] == [
        ("on_switch", "passed", v2),
        ("health", "failed", v2),
        ("on_switch", "passed", 1),
    ]
    # the boards, their applications, deployed.json and the rollout's record agree
    assert (runs(fleet, "fast-1"), runs(fleet, "fast-2")) == (v2, 1)
    assert {name: (app / f"{name}.version").read_text() for name in ("fast-1", "fast-2")} == {
        "fast-1": f"{v2}\n",
        "fast-2": "1\n",
    }
    deployed = load_deployed(fleet)
    assert (deployed["fast-1"][MODEL], deployed["fast-2"][MODEL]) == (v2, 1)
    events = [json.loads(line) for line in journal_path(fleet).read_text().splitlines()]
    recorded = next(e for e in reversed(events) if e["kind"] == "rollout" and e["model"] == MODEL)
    assert recorded["outcomes"] == json.loads(json.dumps(result.records()))
