"""Checks shared by the tests that create and destroy simulated fleets."""

from __future__ import annotations

import subprocess

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
