"""TVM's RPC tracker client, and why edgetune speaks the tracker protocol itself.

TVM 0.27's `TrackerSession` (`tvm.rpc.connect_tracker`):
- `request(key)` connects to the server the tracker hands out and returns only the session,
  without that server's address, so a caller cannot tell which board it got (edgetune needs it
  to reach every board of a class, and to report which board failed);
- writes each message's length and body apart on a socket without TCP_NODELAY, and the
  tracker answers the same way, so Nagle's algorithm and delayed ACKs stall every exchange
  (tens of milliseconds each on loopback).
No upstream issue found. edgetune's client is its own tracker access, not a shim, so it stays
in edgetune.fleet.tracker (`_TrackerConnection`: one write per message, TCP_NODELAY, and
TCP_QUICKACK before each read). Test: tests/tvm_compat/test_tracker_client.py.
"""
