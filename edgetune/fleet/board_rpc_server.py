"""What `edgetune fleet up` runs on a board: TVM's rpc_server, started again whenever it drops
out of its tracker.

TVM 0.27's rpc_server serves each session in a child process, and its listening thread ends
when that child exits non-zero, which is what a session whose client vanished does (the host
killed mid-measurement, a network drop: the child's read fails with "connection reset by
peer"). The process lives on but is no longer registered, so the board is lost to the fleet
until someone restarts it. Here a watchdog asks the tracker every CHECK_PERIOD_S whether this
server is registered and, after MISSING_CHECKS misses in a row, starts a fresh one.

`board.start_server` uploads this file to the board and runs it as a script, so it uses only
the standard library and the TVM runtime, nothing of edgetune:

    python edgetune-rpc-server.py --tracker HOST:PORT --key KEY --host ADDR --custom-addr ADDR --port 9090
"""

from __future__ import annotations

import argparse
import logging
import time

from tvm import rpc

CHECK_PERIOD_S = 5.0
MISSING_CHECKS = 2  # a reconnecting server is away for milliseconds, a dead one for good

log = logging.getLogger("edgetune.board_rpc_server")


def registered(tracker: tuple[str, int], key: str, address: tuple[str, int]) -> bool | None:
    """Whether the tracker lists a server of `key` at `address`; None if it cannot be asked."""
    try:
        session = rpc.connect_tracker(*tracker)
        try:
            servers = session.summary()["server_info"]
        finally:
            session.close()
    except (OSError, RuntimeError):
        return None
    return any(info["key"] == f"server:{key}" and tuple(info["addr"]) == address for info in servers)


def wait_until_dropped(tracker: tuple[str, int], key: str, address: tuple[str, int]) -> None:
    """Return once the server has been missing from a reachable tracker MISSING_CHECKS times in a
    row (while the tracker cannot be reached, the server cannot register either: keep it)."""
    missing = 0
    while missing < MISSING_CHECKS:
        time.sleep(CHECK_PERIOD_S)
        state = registered(tracker, key, address)
        if state is not None:
            missing = 0 if state else missing + 1


def serve(args: argparse.Namespace) -> None:
    host, port = args.tracker.rsplit(":", 1)
    tracker = (host, int(port))
    while True:
        server = rpc.Server(args.host, args.port, args.port_end, key=args.key, tracker_addr=tracker,
                            custom_addr=args.custom_addr)  # fmt: skip
        log.info("rpc_server on %s:%d registers with %s:%d as %r", args.custom_addr, server.port, *tracker, args.key)
        wait_until_dropped(tracker, args.key, (args.custom_addr, server.port))
        log.warning("the tracker has not listed this rpc_server for %d checks %g s apart; starting a new one",
                    MISSING_CHECKS, CHECK_PERIOD_S)  # fmt: skip
        server.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    parser.add_argument("--key", required=True, help="the key to register under (the device class)")
    parser.add_argument("--host", required=True, help="the address to listen on")
    parser.add_argument("--custom-addr", required=True, help="the address the tracker hands to clients")
    parser.add_argument("--port", type=int, default=9090, help="the first port to try")
    parser.add_argument("--port-end", type=int, default=9199, help="one past the last port to try")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
