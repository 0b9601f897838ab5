"""Checks shared by the tests that create and destroy simulated fleets."""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager

from edgetune.fleet import cgroups
from edgetune.fleet.sim import plan_sim


def leftovers(fleet) -> list[str]:
    found = []
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for sim in plan_sim(fleet):
        found += [sim.netns] if sim.netns in names else []
        found += [sim.veth] if sim.veth in links else []
        found += [sim.cgroup] if cgroups.cgroup_dir(sim.cgroup).exists() else []
    found += [fleet.sim.bridge] if f" {fleet.sim.bridge}:" in links else []
    return found


@contextmanager
def running(fleet, register_timeout_s: float = 60.0):
    """The fleet's simulated boards up and every board registered; all torn down after."""
    from edgetune.fleet import fleet_down, fleet_up, sim_down, sim_up

    try:
        simulated = sim_up(fleet)
        assert simulated.ok, f"sim up failed: {simulated.failed}"
        online = fleet_up(fleet, register_timeout_s=register_timeout_s)
        assert online.ok, f"fleet up failed: {online.failed}"
        yield fleet
    finally:
        try:
            fleet_down(fleet)
        finally:
            sim_down(fleet)


@contextmanager
def link_down(fleet, board: str, back_within_s: float = 30.0, registered_within_s: float = 90.0):
    """Board `board`'s network link down for the block; after it, up again and the board taking an
    SSH session (for a moment after the link comes up, its neighbour entry may still read 'no
    route to host'), and, if it was registered with its tracker before, registered again (its SSH
    transport's keeper reconnects, then its rpc_server finds the tracker, or its watchdog starts a
    fresh one), so what follows finds the board back as an operator would."""
    from edgetune.errors import FleetError
    from edgetune.fleet.ssh import BoardSession

    was_registered = _registered(fleet, board)
    netns = next(s.netns for s in plan_sim(fleet) if s.board.name == board)
    subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "down"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "-n", netns, "link", "set", "eth0", "up"], check=True)
    deadline = time.monotonic() + back_within_s
    while True:
        try:
            with BoardSession(fleet.board(board)) as session:
                session.run("true")
            break
        except FleetError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    deadline = time.monotonic() + registered_within_s
    while was_registered and not _registered(fleet, board):
        assert time.monotonic() < deadline, f"{board} did not register again within {registered_within_s:g} s"
        time.sleep(0.5)


def _registered(fleet, board: str) -> bool:
    """Whether `board` is registered with the tracker `fleet up` recorded for it (False: none)."""
    from edgetune.errors import EdgetuneError
    from edgetune.fleet.ssh_route import rpc_address
    from edgetune.fleet.state import load_fleet_state
    from edgetune.fleet.tracker import query_tracker

    record = load_fleet_state(fleet).trackers.get(fleet.board(board).tracker)
    try:
        summary = query_tracker(record) if record is not None else None
    except EdgetuneError:
        return False
    return summary is not None and summary.registered(fleet.board(board).device_class, rpc_address(fleet.board(board)))
