"""TVM's runtime library lacks the random fill that MetaSchedule's runner calls on the board.

MetaSchedule's RPC runner fills every argument of a measured kernel with
`tvm.contrib.random.random_fill_for_measure`, a function of TVM's compiler library
(`libtvm.so`). A board that loads the runtime library alone (`TVM_USE_RUNTIME_LIB=1`, or a
runtime-only TVM) has no such function, and every measurement on it fails.

The board's rpc_server registers a NumPy stand-in where the function is missing
(`register_measure_fill` in `fleet/board_rpc_server.py`, on boards without edgetune).
The test: tests/tvm_compat/test_runtime_fill.py.
"""
