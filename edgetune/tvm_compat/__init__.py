"""edgetune's workarounds of Apache TVM 0.27 (apache-tvm 0.27.0.post1, apache-tvm-ffi
0.1.14.post1), one module per gap: what upstream does, the upstream issue where one exists, and
the code that works around it. Each has a strict-xfail test in tests/tvm_compat that reproduces
TVM's behaviour on the installed version: the day TVM fixes it, that test passes and fails the
suite, saying the workaround can go (docs/tvm.md lists them).

This package imports only TVM and the floors below it. Where the workaround is edgetune's own
feature rather than a shim around TVM (edgetune's tracker client, the board's rpc_server
watchdog and its random fill, which run on boards without edgetune, the servers run in
the process that starts them, stopping on a signal, the compiler's layout
rewrites), the code stays where the feature lives and its module here records the gap and
carries the test:

- `tensor_intrin`: one CPU architecture's tensor intrinsics without importing all of TVM's;
- `vnni`: the VNNI dot-product intrinsic, since TVM's does not compile with its LLVM;
- `build`: MetaSchedule's candidate build without the intrinsics import, in kept workers;
- `rpc_session`: sessions that end only when freed; a loaded file name cached per session;
- `rpc_server`: TVM's rpc_server stops listening after a reset session (the watchdog: fleet);
- `tracker_client`: TVM's tracker client hides the server and stalls (the client: fleet);
- `serving_process`: TVM's rpc_server and tracker serve from a second process (fleet);
- `runtime_fill`: the runtime library lacks MetaSchedule's random fill (the stand-in: fleet);
- `database_lines`: JSON database files repaired before TVM reads them;
- `record_lines`: tuning records sent as database lines, since `as_json` refuses IndexMaps;
- `search_strategy`: initializing a wrapped search strategy (a name with an underscore);
- `python_callbacks`: exceptions raised in Python callbacks under the C++ loop (the stop: tune);
- `native_warnings`: TVM's C++ warnings on file descriptor 2 (the routing: tune.native_log);
- `relax_layout`: ConvertLayout's and RewriteLayout's gaps (the rewrites: compiler);
- `ffi_pin`: the apache-tvm-ffi version pinned in pyproject.toml.
"""
