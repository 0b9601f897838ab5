"""fleet.yaml of a simulated fleet a test module builds on a slot of its own (`sim_slot`): the
network of the slot (bridge `etune-tN`, subnet 10.231.(9+N).0/24, tracker ports 9290+10N to
9299+10N, artifact server port 8470+N, as tests/conftest.py's session fleet) and its SSH, then
the module's own classes, boards and models."""

from __future__ import annotations

HEADER = """\
version: 1
name: {name}-t{slot}
workdir: work
sim: {{bridge: etune-t{slot}, host_address: 10.231.{subnet}.1/24}}
trackers:
  - {{name: host, bind_host: 10.231.{subnet}.1, public_address: 10.231.{subnet}.1, port: {port}, port_end: {port_end}}}
ssh: {{user: root, key: work/sim/id_ed25519, known_hosts: work/known_hosts, connect_timeout_s: {connect_timeout_s}, command_timeout_s: {command_timeout_s}}}
"""


def slot_network(slot: int) -> dict[str, int]:
    """The addresses and ports of slot `slot`, by the names fleet.yaml templates use."""
    return {
        "slot": slot,
        "subnet": 9 + slot,
        "port": 9290 + 10 * slot,
        "port_end": 9299 + 10 * slot,
        "deploy_port": 8470 + slot,
    }


def sim_fleet_yaml(
    slot: int, name: str, body: str, connect_timeout_s: float = 3, command_timeout_s: float = 60, **values: object
) -> str:
    """The fleet `name` on slot `slot`: the slot's network and SSH, then `body` (a fleet.yaml
    template of the rest, with `{subnet}`, `{deploy_port}` ... and `values` filled in)."""
    network = slot_network(slot)
    timeouts = {"connect_timeout_s": connect_timeout_s, "command_timeout_s": command_timeout_s}
    return HEADER.format(name=name, **network, **timeouts) + body.format(**network, **values)
