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
"""

from edgetune.fleet.lifecycle import fleet_down, fleet_up
from edgetune.fleet.parallel import GroupResult
from edgetune.fleet.sim import sim_down, sim_up
from edgetune.fleet.status import BoardStatus, ClassStatus, fleet_status, tracker_status
from edgetune.fleet.tracker import RpcEndpoint, board_sessions, rpc_endpoint
from edgetune.fleet.trust import trust_board

__all__ = [
    "BoardStatus",
    "ClassStatus",
    "GroupResult",
    "RpcEndpoint",
    "board_sessions",
    "fleet_down",
    "fleet_status",
    "fleet_up",
    "rpc_endpoint",
    "sim_down",
    "sim_up",
    "tracker_status",
    "trust_board",
]
