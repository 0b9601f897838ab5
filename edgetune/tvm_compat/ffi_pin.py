"""The apache-tvm-ffi version edgetune pins (pyproject.toml), and why.

apache-tvm 0.27.0.post1 asks only for `apache-tvm-ffi>=0.1.14.post0`, so pip installs the
newest, and with 0.1.15.post2 `tvm.ir.save_json(mod)` segfaults in `ToJSONGraph`: every
MetaSchedule TuneContext dies with it. 0.1.14.post0 and 0.1.14.post1 work. No upstream
issue found. Test: tests/tvm_compat/test_ffi_pin.py (apache-tvm's own requirement still admits
the broken version).
"""

TVM_FFI_PIN = "0.1.14.post1"
BROKEN_TVM_FFI = "0.1.15.post2"
