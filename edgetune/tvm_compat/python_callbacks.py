"""Python exceptions raised inside MetaSchedule's C++ loop do not come back as themselves.

TVM 0.27: a Python callback that MetaSchedule's C++ code calls (a schedule rule, a postproc, a
measure callback, a search strategy's step) runs under TVM's FFI, which turns an exception
raised there into a C++ error; the evolutionary search runs postprocs in `parallel_for_dynamic`,
which reports it as a bare "parallel_for_dynamic error", and trace application logs and drops a
candidate whose schedule raised. So a `KeyboardInterrupt` from a signal handler, which Python
raises wherever the main thread happens to be, does not stop tuning as such: it becomes some
candidate's error, or a generic RuntimeError. No upstream issue found.

edgetune's stop (edgetune.tune.stop) is its own feature, not a shim, so it stays there: the
signal handler only sets an event, and the budget scheduler reads it before each round.
Test: tests/tvm_compat/test_python_callbacks.py.
"""
