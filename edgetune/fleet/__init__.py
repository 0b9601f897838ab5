"""Side effects on machines: SSH to boards, the host's TVM tracker, rpc_servers on boards,
and the simulated local fleet. One module per role:

- `ssh`: a lazy, strictly host-key-checked paramiko session per board (`BoardSession.run`),
  through the bastions of its route; `ssh_route`: that route, from fleet.yaml and the ssh config.
- `tracker`: TVM's rpc_tracker on the host, started in its own process group, queried, and
  asked for board sessions; `RpcEndpoint` / `rpc_endpoint`: where a device class is reached.
- `on_board`: preflight a board and start/stop its rpc_server over SSH.
- `tunnel`, `forward`: the SSH transport: a keeper process per board holding the forwards that
  carry the tracker and RPC over the board's SSH connection.
- `agent_bundle`: the board agent as one hash-checked zipapp, delivered to boards over SSH.
- `lifecycle`: `fleet_up` / `fleet_down` over all boards in parallel (`GroupResult`).
- `status`: `fleet_status`, `tracker_status` (read-only).
- `trust`: `trust_board`, the operator's explicit acceptance of a host key.
- `sim`, `cgroups`: `sim_up` / `sim_down`, real boards in network namespaces on this machine.
- `state`, `process`, `parallel`, `errors`: state file, host processes, fan-out, error types.

The names below are the package's public face. They are imported on first use, so that a
process that needs one module (the SSH transport's keeper: `tunnel`) does not load TVM.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "fleet_down": "lifecycle",
    "fleet_up": "lifecycle",
    "GroupResult": "parallel",
    "sim_down": "sim",
    "sim_up": "sim",
    "BoardStatus": "status",
    "ClassStatus": "status",
    "fleet_status": "status",
    "tracker_status": "status",
    "RpcEndpoint": "tracker",
    "board_sessions": "tracker",
    "rpc_endpoint": "tracker",
    "trust_board": "trust",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'edgetune.fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(f"edgetune.fleet.{_PUBLIC[name]}"), name)
