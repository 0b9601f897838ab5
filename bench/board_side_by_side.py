"""Runs ON THE BOARD (uploaded and started over SSH by side_by_side.py): times the untuned TVM
build, the tuned TVM build, onnxruntime and OpenVINO (each where this Python has it) in this one
process, the same way (a Python loop, time.perf_counter_ns around every call), interleaved in
rounds with the order rotated every round (ABC, BCA, CAB, ...), on the same input; then an fp32
GEMM (numpy/OpenBLAS sgemm, at the board's threads) as the machine's peak. A runtime whose
outputs lie further than `tolerance` from the reference (`expected`) is not timed: its largest
difference is in `not_timed`. Prints one JSON object.

    python board_side_by_side.py SPEC.json

SPEC: {"libraries": {"label": ".so path"}, "entry": "main", "onnx": path, "inputs": npz path,
"input_order": [...], "expected": npz path ("output0", ...), "tolerance": 1e-5, "threads": 1,
"rounds": 10, "round_ms": 200, "ort_profile": prefix|null}
Thread counts (OPENBLAS_NUM_THREADS, TVM_NUM_THREADS) must be set in the environment before
this starts.
"""

import json
import sys
import time

import numpy as np

GEMM_N = 1024
GEMM_CALLS = 30
WARMUP_S = 0.3


def tvm_runner(path, entry, arrays):
    import tvm
    from tvm import relax

    device = tvm.cpu()
    vm = relax.VirtualMachine(tvm.runtime.load_module(path), device)
    tensors = [tvm.runtime.tensor(a, device) for a in arrays]
    function = vm[entry]

    def call():
        return function(*tensors)

    def outputs():
        result = call()
        items = [result] if hasattr(result, "numpy") else list(result)
        return [item.numpy() for item in items]

    return call, outputs


def ort_runner(path, feed, threads, profile_prefix):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def call():
        return session.run(None, feed)

    return call, call, session


def openvino_runner(path, feed, threads):
    """OpenVINO as the artifact build runs it on a board (edgetune/fleet/board_rpc_server.py):
    its CPU plugin, the LATENCY hint, one stream, float32 precision, `threads` threads; the
    inputs set once."""
    import openvino

    config = {
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": threads,
    }
    compiled = openvino.Core().compile_model(path, "CPU", config)
    request = compiled.create_infer_request()
    request.infer(feed)

    def call():
        return request.infer(share_outputs=True)

    def outputs():
        answer = request.infer()
        return [answer[port] for port in compiled.outputs]

    return call, outputs


def has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def runtime_mismatches(results, expected, tolerance):
    """{runtime label: its largest difference from `expected`} for the runtimes beyond `tolerance`."""
    wrong = {}
    for label in ("onnxruntime", "openvino"):
        if label in results:
            diff = max(
                float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
                for g, w in zip(results[label], expected)
            )
            if diff > tolerance:
                wrong[label] = diff
    return wrong


def warm_up(call):
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_S:
        call()


def interleaved(calls, rounds, round_ms):
    """{label: [[ns per call, ...] per round]}; each round gives every label >= round_ms of calls
    (at least one), the labels' order rotated by one each round."""
    labels = list(calls)
    samples = {label: [] for label in labels}
    budget_ns = round_ms * 1e6
    for round_no in range(rounds if labels else 0):
        shift = round_no % len(labels)
        for label in labels[shift:] + labels[:shift]:
            call, spent, these = calls[label], 0, []
            while spent < budget_ns or not these:
                t0 = time.perf_counter_ns()
                call()
                these.append(time.perf_counter_ns() - t0)
                spent += these[-1]
            samples[label].append(these)
    return samples


def gemm_gflops():
    """fp32 GEMM rate at OPENBLAS_NUM_THREADS threads: each of GEMM_CALLS calls timed, GFLOP/s of every call."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    b = rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32)
    out = np.empty_like(a)
    np.matmul(a, b, out=out)
    rates = []
    for _ in range(GEMM_CALLS):
        t0 = time.perf_counter_ns()
        np.matmul(a, b, out=out)
        rates.append(2 * GEMM_N**3 / (time.perf_counter_ns() - t0))
    return rates


def main():
    spec = json.loads(open(sys.argv[1]).read())
    with np.load(spec["inputs"]) as data:
        feed = {name: data[name] for name in spec["input_order"]}
    arrays = [feed[name] for name in spec["input_order"]]
    calls, outputs = {}, {}
    for label, path in spec["libraries"].items():
        calls[label], outputs[label] = tvm_runner(path, spec["entry"], arrays)
    session = None
    if spec.get("onnx"):
        calls["onnxruntime"], outputs["onnxruntime"], session = ort_runner(
            spec["onnx"], feed, spec["threads"], spec.get("ort_profile")
        )
        if has("openvino"):
            calls["openvino"], outputs["openvino"] = openvino_runner(spec["onnx"], feed, spec["threads"])
    results = {label: [np.asarray(o) for o in fn()] for label, fn in outputs.items()}
    not_timed = {}
    if spec.get("expected"):
        with np.load(spec["expected"]) as data:
            expected = [data[f"output{i}"] for i in range(len(data.files))]
        not_timed = runtime_mismatches(results, expected, spec["tolerance"])
    for label in not_timed:
        del calls[label]
    for call in calls.values():
        warm_up(call)
    gemm_before = gemm_gflops()
    samples = interleaved(calls, spec["rounds"], spec["round_ms"])
    gemm_after = gemm_gflops()
    profile_file = session.end_profiling() if session is not None and spec.get("ort_profile") else None
    import onnxruntime
    import tvm

    versions = {"onnxruntime": onnxruntime.__version__, "tvm": tvm.__version__, "numpy": np.__version__}
    if "openvino" in results:
        import openvino

        versions["openvino"] = openvino.__version__.split("-")[0]
    print(
        json.dumps(
            {
                "samples_ns": samples,
                "gemm_gflops": gemm_before + gemm_after,
                "gemm_n": GEMM_N,
                "outputs": {label: [o.tolist() for o in outs] for label, outs in results.items()},
                "not_timed": not_timed,
                "ort_profile_file": profile_file,
                "versions": versions,
            }
        )
    )


if __name__ == "__main__":
    main()
