"""A rollout over a fleet of 20 simulated boards with two of them switched off: bench/scale_rollout.py's
scenario (`run_scale`) at a size a test can afford, on a simulated-fleet slot of its own.

Every board is a network namespace with its own sshd whose Python is a board image
(tests/support/board_image.py); mlp is compiled here for the fleet's class and published, the real
artifact server runs as `edgetune serve`, and every board has a pull timer (the agent's own loop
on simulated boards). The links of every 10th board go down, `edgetune rollout` runs, the links
come back. Checked as a user would: the boards taken down, and only they, are pending; every
other board runs the version; every board, the pending ones included, reports it to the server
within a bound derived from the timers' period; nothing of the fleet is left behind. No timing
is asserted (bench/scale_rollout.py measures them).

Marker `scale`: not part of the default `make test`; run it with `make test-scale` (a few minutes
on 2 cores).
"""

from __future__ import annotations

import pytest
from scale_rollout import MODEL, Network, catch_up_bound_s, run_scale, write_fleet_yaml

pytestmark = pytest.mark.scale

BOARDS = 20
OFFLINE_PCT = 10.0
PERIOD_S = 5.0


@pytest.fixture(scope="module")
def scale_run(sim_slot, tmp_path_factory):
    """The scenario, run once for the module on slot N's bridge and subnet (10.231.(9+N).0/24):
    what it measured (`ScaleRun`); the fleet is down again when it returns."""
    from support.board_image import board_image

    from edgetune.fleet.errors import SimError
    from edgetune.fleet.sim import check_prerequisites
    from edgetune.inventory import load_fleet

    try:
        check_prerequisites()
    except SimError as err:
        pytest.skip(f"no simulated fleet on this machine: {err}")
    net = Network(
        f"scale-t{sim_slot}",
        f"etune-t{sim_slot}",
        f"10.231.{9 + sim_slot}.0/24",
        deploy_port=8470 + sim_slot,
        tracker_port=9290 + 10 * sim_slot,
    )
    root = tmp_path_factory.mktemp("scale")
    # a connect timeout above the default fleet's 10 s: on a loaded 2-core host, an SSH key exchange
    # can take longer than that, and a board not reached in time is pending, not one of those taken down
    fleet = load_fleet(write_fleet_yaml(root, net, BOARDS, board_image() / "bin" / "python", connect_timeout_s=15))
    return run_scale(fleet, offline_pct=OFFLINE_PCT, period_s=PERIOD_S)


def test_the_rollout_succeeds_with_the_boards_taken_offline_and_only_them_pending(scale_run):
    result = scale_run.result
    records = {record["board"]: record for record in result.records()}
    assert len(scale_run.offline) == round(BOARDS * OFFLINE_PCT / 100)
    assert result.ok and result.stopped is None, [
        r for r in records.values() if r["result"] not in ("installed", "unchanged")
    ]
    assert sorted(result.pending) == sorted(scale_run.offline), records
    for name in scale_run.offline:
        assert "not reachable at its turn" in records[name]["error"], records[name]


def test_every_board_not_taken_offline_runs_the_version(scale_run):
    version = scale_run.versions[scale_run.fleet.boards[0].device_class]
    reached = [r for r in scale_run.result.records() if r["board"] not in scale_run.offline]
    assert len(reached) == BOARDS - len(scale_run.offline)
    assert {
        r["board"]: (r["result"], r["runs"])
        for r in reached
        if r["result"] not in ("installed", "unchanged") or r["runs"] != version
    } == {}


def test_once_the_links_are_back_every_board_reports_the_version_within_a_bound_from_the_period(scale_run):
    assert scale_run.catch_up_bound_s == catch_up_bound_s(PERIOD_S)
    late = [name for name, seconds in scale_run.catch_up.items() if seconds is None]
    assert sorted(scale_run.catch_up) == sorted(scale_run.offline) and late == [], scale_run.catch_up
    version = scale_run.versions[scale_run.fleet.boards[0].device_class]
    assert scale_run.reported_at_end == {b.name: version for b in scale_run.fleet.boards}


def test_the_server_answered_every_request_of_the_boards(scale_run):
    lines = scale_run.idle_lines + scale_run.rollout_lines + scale_run.catch_up_lines
    tarballs = [line for line in scale_run.rollout_lines + scale_run.catch_up_lines if line["path"].endswith(".tar.gz")]
    assert len(tarballs) >= BOARDS  # every board downloaded the version once (a timer's retry may add one)
    assert [line for line in lines if line["status"] >= 400] == []


def test_nothing_of_the_fleet_is_left(scale_run):
    from support.sim_checks import leftovers

    assert leftovers(scale_run.fleet) == []
    assert MODEL in {m.name for m in scale_run.fleet.models}
