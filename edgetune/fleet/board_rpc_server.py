"""What `edgetune fleet up` runs on a board: TVM's rpc_server, started again whenever it drops
out of its tracker.

TVM 0.27's rpc_server serves each session in a child process, and its listening thread ends
when that child exits non-zero, which is what a session whose client vanished does (the host
killed mid-measurement, a network drop: the child's read fails with "connection reset by
peer"). The process lives on but is no longer registered, so the board is lost to the fleet
until someone restarts it (edgetune.tvm_compat.rpc_server). Here a watchdog asks the tracker
every CHECK_PERIOD_S whether this server is registered and, after MISSING_CHECKS misses in a
row, starts a fresh one.

Besides TVM's own functions, a session can time the model's ONNX file with onnxruntime and with
OpenVINO where the board's Python has them (`edgetune.onnxruntime.*`, `edgetune.openvino.*`,
below): the artifact build compares the tuned library against the runtimes the board would
otherwise run, on the board itself, timed the way TVM's `time_evaluator` times the libraries and
in the same interleaved rounds. Each RPC session is a process of its own, so what a session
loads is its own.

`board.start_server` uploads this file to the board and runs it as a script, so it uses only
the standard library, numpy and the TVM runtime (and onnxruntime and OpenVINO when the board has
them), nothing of edgetune:

    python edgetune-rpc-server.py --tracker HOST:PORT --key KEY --host ADDR --custom-addr ADDR --port 9090

It first connects to the tracker once (`--check-only`: only that): a board that cannot reach it
says why at once (no route, refused, timed out) and exits with status 3, instead of retrying
without a word.
"""

from __future__ import annotations

import argparse
import errno
import io
import json
import logging
import os
import socket
import sys
import time

CHECK_PERIOD_S = 5.0
TRACKER_CONNECT_TIMEOUT_S = 5.0
UNREACHABLE = 3  # the exit status when the tracker cannot be reached
SERVING = "serves, registering with"  # in the log once the server listens (`on_board.start_server` waits for it)
MISSING_CHECKS = 2  # a reconnecting server is away for milliseconds, a dead one for good

log = logging.getLogger("edgetune.board_rpc_server")


def registered(tracker: tuple[str, int], key: str, address: tuple[str, int]) -> bool | None:
    """Whether the tracker lists a server of `key` at `address`; None if it cannot be asked."""
    from tvm import rpc

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


def register_runtimes() -> None:
    """Register `edgetune.onnxruntime.*` and `edgetune.openvino.*` in this process, where the
    sessions are forked from.

    Each runtime opens the uploaded ONNX file the way an application after one request's lowest
    latency would, at this board's runtime threads (TVM_NUM_THREADS, as `fleet up` starts this server; else the
    runtime's default), one request at a time: onnxruntime with its default graph optimizations
    on its CPU provider, sequential; OpenVINO compiled for its CPU plugin with the LATENCY hint,
    one stream and float32 precision (on CPUs with bfloat16 units its default precision is
    bfloat16, which the tuned build does not compute in)."""
    import tvm

    loaded: dict[str, dict] = {}  # this session's (a forked process): runtime -> "run", "outputs", "number"

    def onnxruntime_open(model_path: str, feed: dict, threads: int) -> dict:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])

        def run() -> list:
            return session.run(None, feed)

        return {"run": run, "outputs": run}

    def openvino_open(model_path: str, feed: dict, threads: int) -> dict:
        import openvino

        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        compiled = openvino.Core().compile_model(model_path, "CPU", config)
        request = compiled.create_infer_request()
        request.infer(feed)  # sets the inputs, which every later call reuses

        def outputs() -> list:
            answer = request.infer()
            return [answer[port] for port in compiled.outputs]

        return {"run": lambda: request.infer(share_outputs=True), "outputs": outputs}

    def register(name: str, open_model) -> None:
        @tvm.register_global_func(f"edgetune.{name}.version", override=True)
        def version() -> str:
            """The runtime's version on this board; "" where its Python has none."""
            try:
                module = __import__(name)
            except (ImportError, OSError):  # OSError: a wheel whose native libraries do not load here
                return ""
            return str(module.__version__).split("-")[0]  # OpenVINO's: "2026.4.1-<build>-<branch>"

        @tvm.register_global_func(f"edgetune.{name}.load", override=True)
        def load(model_file: str, inputs_file: str) -> int:
            """Open the uploaded ONNX file with the uploaded inputs (.npz, every input the graph
            takes); return the thread count it runs at (0: the runtime's default)."""
            import numpy as np

            workpath = tvm.get_global_func("tvm.rpc.server.workpath")
            threads = int(os.environ.get("TVM_NUM_THREADS", "0"))
            with np.load(workpath(inputs_file)) as inputs:
                feed = {key: inputs[key] for key in inputs.files}
            loaded[name] = dict(open_model(workpath(model_file), feed, threads), number=1)
            return threads

        @tvm.register_global_func(f"edgetune.{name}.outputs", override=True)
        def outputs() -> bytearray:
            """The loaded model's outputs on its inputs, as .npz bytes ("output0", "output1", ...)."""
            import numpy as np

            buffer = io.BytesIO()
            values = loaded[name]["outputs"]()
            np.savez(buffer, **{f"output{i}": np.asarray(value) for i, value in enumerate(values)})
            return bytearray(buffer.getvalue())

        @tvm.register_global_func(f"edgetune.{name}.turn", override=True)
        def turn(repeat: int, min_repeat_ms: float, cooldown_ms: float) -> str:
            """One turn of the loaded model, as TVM's time_evaluator makes one: a discarded
            warm-up call, then `repeat` samples, each the mean of as many calls as fill
            `min_repeat_ms` (the count grown as time_evaluator grows it, and kept for the next
            turn), a pause of `cooldown_ms` after each. A JSON list of seconds."""
            model = loaded[name]
            run = model["run"]
            run()
            samples = []
            for _ in range(repeat):
                number = model["number"]
                while True:
                    start = time.perf_counter()
                    for _ in range(number):
                        run()
                    elapsed_ms = (time.perf_counter() - start) * 1e3
                    if elapsed_ms >= min_repeat_ms:
                        break
                    number = int(max(min_repeat_ms / (max(elapsed_ms, 1e-6) / number) + 1, number * 1.618))
                model["number"] = number
                samples.append(elapsed_ms / 1e3 / number)
                time.sleep(cooldown_ms / 1e3)
            return json.dumps(samples)

    register("onnxruntime", onnxruntime_open)
    register("openvino", openvino_open)


def tracker_problem(tracker: tuple[str, int]) -> str | None:
    """Why a TCP connection to the tracker fails (None: it opens)."""
    try:
        socket.create_connection(tracker, timeout=TRACKER_CONNECT_TIMEOUT_S).close()
        return None
    except TimeoutError:
        return f"timed out after {TRACKER_CONNECT_TIMEOUT_S:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as err:
        if err.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to it"
        return err.strerror or str(err)


def register_measure_fill() -> None:
    """Register `tvm.contrib.random.random_fill_for_measure` where this TVM lacks it: the
    runtime library alone (TVM_USE_RUNTIME_LIB=1, or a runtime-only TVM on a board) does not
    have it, and MetaSchedule's runner fills every measured kernel's arguments with it. Floats
    come uniform in [1, 10), integers in [0, 10), as TVM's own fills them."""
    import numpy as np
    import tvm

    if tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True) is not None:
        return
    rng = np.random.default_rng()

    @tvm.register_global_func("tvm.contrib.random.random_fill_for_measure")
    def random_fill_for_measure(tensor) -> None:
        shape, dtype = tuple(tensor.shape), str(tensor.dtype)
        if dtype.startswith(("float", "bfloat")):
            values = rng.uniform(1.0, 10.0, size=shape).astype(dtype)
        elif dtype == "bool":
            values = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            values = rng.integers(0, 10, size=shape).astype(dtype)
        tensor.copyfrom(values)


def serve(args: argparse.Namespace, tracker: tuple[str, int]) -> None:
    """Serve in this process until the tracker drops it, then start afresh in this process
    (`os.execv`, the same PID and command line). TVM's `rpc.Server` would serve from a pool
    worker, a second process importing TVM again; `PopenRPCServerState` is that worker's
    server, run here. Sessions load libraries and time them: TVM's runtime library is all
    they need, so it is all that loads unless the board set TVM_USE_RUNTIME_LIB itself."""
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    from tvm.rpc.server import PopenRPCServerState  # here: `--check-only` needs nothing of TVM

    register_runtimes()
    register_measure_fill()
    started_in = os.getcwd()
    server = PopenRPCServerState(
        args.host, args.port, args.port_end, tracker_addr=tracker, key=args.key, custom_addr=args.custom_addr
    )
    log.info(f"rpc_server on %s:%d {SERVING} %s:%d as %r", args.custom_addr, server.port, *tracker, args.key)
    wait_until_dropped(tracker, args.key, (args.custom_addr, server.port))
    log.warning(
        "the tracker has not listed this rpc_server for %d checks %g s apart; starting a new one",
        MISSING_CHECKS,
        CHECK_PERIOD_S,
    )
    logging.shutdown()
    os.chdir(started_in)  # TVM serves each session in a directory of its own, removed by now
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracker", required=True, help="HOST:PORT of the tracker")
    parser.add_argument("--key", required=True, help="the key to register under (the device class)")
    parser.add_argument("--host", required=True, help="the address to listen on")
    parser.add_argument("--custom-addr", required=True, help="the address the tracker hands to clients")
    parser.add_argument("--port", type=int, default=9090, help="the first port to try")
    parser.add_argument("--port-end", type=int, default=9199, help="one past the last port to try")
    parser.add_argument("--check-only", action="store_true", help="only check that the tracker can be reached")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host, port = args.tracker.rsplit(":", 1)
    tracker = (host, int(port))
    problem = tracker_problem(tracker)
    if problem:
        print(f"cannot reach the tracker at {args.tracker}: {problem}", file=sys.stderr, flush=True)
        sys.exit(UNREACHABLE)
    if not args.check_only:
        serve(args, tracker)


if __name__ == "__main__":
    main()
