"""TVM's rpc_server stops serving, for good, after one session whose client vanished.

TVM 0.27 serves each session in a child process; `_serving` raises when that child exits
non-zero (apache/tvm#17101, "Raise error if server process terminated"), and `_listen_loop`
calls it outside its `try`, so the listening thread ends. A session whose client resets the
connection (the host killed mid-measurement, a network drop) makes the child exit non-zero:
the server process lives on, no longer registered, and its board is lost to the fleet.

edgetune's watchdog (edgetune.fleet.board_rpc_server: it asks the tracker whether the server
is still registered and starts a fresh one when it is not) stays in edgetune.fleet: it runs on
the boards as a standalone script with nothing of edgetune. The test resets one session of a
loopback rpc_server and opens the next: tests/tvm_compat/test_rpc_server.py.
"""
