"""TVM's rpc_server and tracker serve from a second process, which imports TVM again.

TVM 0.27's `rpc.Server` and `rpc.Tracker` start a `PopenWorker` and serve from it: every
board's rpc_server and every tracker is two processes that each import TVM, which takes
seconds on a small board. `PopenRPCServerState` and `PopenTrackerServerState`,
the servers those workers run, serve from the process that creates them.

edgetune runs them so: the board's rpc_server (`fleet/board_rpc_server.py`, on boards without
edgetune) and the host's tracker (`fleet/rpc_tracker.py`). The test: tests/tvm_compat/test_serving_process.py.
"""
