"""The host's TVM RPC tracker as `edgetune fleet up` starts it (edgetune.fleet.tracker), served
from this one process:

    python -m edgetune.fleet.rpc_tracker --host ADDR --port P --port-end E

TVM's `tvm.exec.rpc_tracker` serves from a pool worker it starts, a second process that
imports TVM again; `PopenTrackerServerState` is that worker's server, run here. The tracker
brokers sockets in Python (`tvm.rpc.base`), so TVM's runtime library is all it loads.
"""

from __future__ import annotations

import argparse
import logging
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True, help="the address to listen on")
    parser.add_argument("--port", type=int, required=True, help="the first port to try")
    parser.add_argument("--port-end", type=int, required=True, help="one past the last port to try")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    from tvm.rpc.tracker import PopenTrackerServerState

    PopenTrackerServerState(args.host, args.port, args.port_end).thread.join()


if __name__ == "__main__":
    main()
