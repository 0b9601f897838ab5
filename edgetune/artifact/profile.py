"""Where a build's time goes: each TVM kernel's time inside the whole model (Relax VM
instrumentation of a bytecode build), the VM's own builtins, and the time outside kernels;
onnxruntime's per-node profile of the same model grouped the same way. FLOPs come from the
TVM kernels (the model's own shapes; onnxruntime's NCHWc nodes see padded, reordered weights),
so a kernel kind's GFLOP/s can be set against the machine's peak for both.

Kinds: pointwise 1x1 convolutions, depthwise KxK, other KxK convolutions, transposed
convolutions, matmul/dense, layout transforms (onnxruntime's NCHWc reorders), and the rest
(element-wise, pooling, reductions). The VM instrument only fires in bytecode builds
(`exec_mode="bytecode"`): `relax.build(..., exec_mode="compiled")` runs the same kernels
without it.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

BUILTIN_PREFIX = "vm.builtin."
PREPACKED_SUFFIX = "_prepacked"  # SplitLayoutRewritePreproc's name for a kernel on pre-packed weights
OTHER = "other kernels (element-wise, pooling, reductions)"
LAYOUT = "layout transforms"
INT8_CONV = "conv int8 (integer kernels / QLinearConv, any kernel size)"


@dataclass(frozen=True)
class KernelRow:
    name: str
    kind: str
    flops: int  # in one model call (all its calls); 0: not counted (onnxruntime nodes, other kinds)
    ms: float  # time per model call (all its calls), median over calls
    calls: int = 1  # calls per model call (a TVM kernel may serve several layers of one shape)
    op: str = ""  # onnxruntime's operator (op_name) of a node; "" for TVM kernels


@dataclass(frozen=True)
class ModelProfile:
    kernels: tuple[KernelRow, ...]
    model_ms: float  # median model call: uninstrumented (TVM), as profiled (onnxruntime)
    builtins_ms: float  # VM builtins (allocation, shape checks, reshapes); 0 for onnxruntime

    @property
    def kernels_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    @property
    def outside_ms(self) -> float:
        """Time of the model call not spent in any kernel (VM, allocation, calls, copies)."""
        return self.model_ms - self.kernels_ms

    def by_kind(self) -> dict[str, tuple[float, int]]:
        """{kind: (ms per call, FLOPs per call)}."""
        out: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for kernel in self.kernels:
            out[kernel.kind][0] += kernel.ms
            out[kernel.kind][1] += kernel.flops
        return {kind: (ms, flops) for kind, (ms, flops) in out.items()}


def conv_kind(weight_shape: Sequence[int], transposed: bool = False) -> str:
    """The kind of a convolution with an (O, I/groups, kh, kw) weight."""
    if transposed:
        return "conv transpose"
    if len(weight_shape) != 4:
        return "conv (other rank)"
    _, per_group, kh, kw = weight_shape
    if kh == kw == 1:
        return "conv 1x1 (pointwise)"
    if per_group == 1:
        return f"conv {kh}x{kw} depthwise"
    return f"conv {kh}x{kw}"


def tvm_kernel_kinds(prepared: tvm.IRModule, layout: str = "NCHW") -> dict[str, tuple[str, int]]:
    """{kernel name: (kind, FLOPs)} of a prepared module's PrimFuncs, compiled in the model's
    `layout` (NHWC: OHWI convolution weights; transposed convolutions stay IOHW). Convolutions and
    matmuls count one multiply-add as 2 FLOPs (as the ONNX count does); the rest count 0."""
    out = {}
    for gv, func in prepared.functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        name = gv.name_hint
        shapes = [[int(d) for d in param.shape] for param in func.params]
        if "conv2d" in name and len(shapes) >= 3:
            transposed = "conv2d_transpose" in name
            weight, output = shapes[1], shapes[-1]
            if layout == "NHWC" and not transposed:
                weight = [weight[0], weight[3], weight[1], weight[2]]  # OHWI -> OIHW
            flops = (
                2 * math.prod(shapes[0]) * math.prod(weight[1:])
                if transposed
                else 2 * math.prod(output) * math.prod(weight[1:])
            )
            out[name] = (conv_kind(weight, transposed), flops)
        elif "integer_conv" in name and len(shapes) >= 3 and len(shapes[1]) == 6:
            _, kh, kw, lanes, _, _ = shapes[1]  # packed (O/16, KH, KW, K/4, 16, 4), edgetune.compiler.relax.integer
            out[name] = (INT8_CONV, 2 * math.prod(shapes[-1]) * 4 * lanes * kh * kw)
        elif "matmul" in name or "dense" in name:
            out[name] = ("matmul / dense", 2 * math.prod(shapes[-1]) * shapes[0][-1])
        else:
            out[name] = (OTHER, 0)
    return out


def profile_vm(vm, entry: str, tensors: Sequence, kinds: dict[str, tuple[str, int]], calls: int) -> ModelProfile:
    """`calls` instrumented model calls of a bytecode-built VM (each kernel timed between the
    instrument's before and after hooks) interleaved with `calls` plain ones. Every row is a
    median over calls (robust to a call preempted on a shared machine), the model time the
    median plain call."""
    function = vm[entry]
    per_call: list[dict[str, int]] = []
    calls_per_model_call: dict[str, int] = {}
    started: dict[str, int] = {}

    def instrument(_func, symbol, before, _ret, *_args):
        now = time.perf_counter_ns()
        if before:
            started[symbol] = now
        else:
            per_call[-1][symbol] = per_call[-1].get(symbol, 0) + now - started.pop(symbol)
            if len(per_call) == 1:
                calls_per_model_call[symbol] = calls_per_model_call.get(symbol, 0) + 1
        return 0

    plain = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        function(*tensors)
        plain.append(time.perf_counter_ns() - t0)
        per_call.append({})
        vm.set_instrument(instrument)
        function(*tensors)
        vm.set_instrument(None)
    symbols = {symbol for call in per_call for symbol in call}
    kernels = [s for s in symbols if not s.startswith(BUILTIN_PREFIX)]
    rows = sorted(
        (
            _kernel_row(
                s, kinds, calls_per_model_call.get(s, 1), statistics.median(c.get(s, 0) for c in per_call) / 1e6
            )
            for s in kernels
        ),
        key=lambda row: -row.ms,
    )
    builtins = statistics.median(sum(ns for s, ns in c.items() if s.startswith(BUILTIN_PREFIX)) for c in per_call)
    return ModelProfile(tuple(rows), statistics.median(plain) / 1e6, builtins / 1e6)


def _kernel_row(symbol: str, kinds: dict[str, tuple[str, int]], calls: int, ms: float) -> KernelRow:
    """A built kernel's row: its FLOPs in one model call are its `calls` calls' FLOPs (a model
    may call one kernel for several layers of the same shape). The tuned build calls a kernel
    whose weights were pre-packed by its prepared name plus PREPACKED_SUFFIX."""
    kind, flops = kernel_kind(symbol, kinds)
    return KernelRow(symbol, kind, flops * calls, ms, calls)


def kernel_kind(symbol: str, kinds: dict[str, tuple[str, int]]) -> tuple[str, int]:
    """(kind, FLOPs of one call) of a built kernel, found by its prepared name."""
    return kinds.get(symbol) or kinds.get(symbol.removesuffix(PREPACKED_SUFFIX), (OTHER, 0))


def onnxruntime_profile(profile_json: Path, skip_runs: int = 0) -> ModelProfile:
    """onnxruntime's profile (SessionOptions.enable_profiling) as per-node rows, each the median
    over runs, like the TVM rows; the first `skip_runs` runs (warm-up) are left out."""
    events = json.loads(Path(profile_json).read_text())
    runs = sorted((e["ts"], e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(runs) <= skip_runs:
        raise ValueError(f"{profile_json}: {len(runs)} model_run events, {skip_runs} to skip")
    starts = [ts for ts, _ in runs]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    kinds: dict[str, tuple[str, str]] = {}  # node: (kind, op)
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        args = event.get("args", {})
        kinds.setdefault(name, (_ort_kind(args), args.get("op_name", "")))
        run = bisect.bisect_right(starts, event["ts"]) - 1
        if run >= skip_runs:
            per_run[run][name] = per_run[run].get(name, 0) + event["dur"]
    counted = per_run[skip_runs:]
    rows = sorted(
        (
            KernelRow(name, kind, 0, statistics.median(r.get(name, 0) for r in counted) / 1e3, op=op)
            for name, (kind, op) in kinds.items()
        ),
        key=lambda row: -row.ms,
    )
    return ModelProfile(tuple(rows), statistics.median(dur for _, dur in runs[skip_runs:]) / 1e3, 0.0)


def profile_onnxruntime(onnx_path: Path, inputs: Mapping[str, np.ndarray], runs: int, threads: int = 1) -> ModelProfile:
    """onnxruntime's per-node profile of the model at `onnx_path` in this process: `runs`
    profiled runs after one warm-up run (left out), `threads` intra-op threads, sequential,
    default graph optimizations, CPU provider."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="edgetune-ortprof-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, dict(inputs))
        return onnxruntime_profile(Path(session.end_profiling()), skip_runs=1)


def _shapes(args: dict, key: str) -> list[list[int]]:
    return [next(iter(entry.values())) for entry in args.get(key, [])]


def _ort_kind(args: dict) -> str:
    op = args.get("op_name", "")
    inputs = _shapes(args, "input_type_shape")
    if op in ("ReorderInput", "ReorderOutput", "Transpose"):
        return LAYOUT
    if "ConvTranspose" in op:
        return "conv transpose"
    if op == "QLinearConv":  # its pre-packed weight is not among the profiled inputs: no kernel size
        return INT8_CONV
    if "Conv" in op and len(inputs) > 1:
        return conv_kind(inputs[1])
    if "MatMul" in op or "Gemm" in op:
        return "matmul / dense"
    return OTHER
