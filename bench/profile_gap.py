"""Where the time goes, TVM vs onnxruntime, on one model: each TVM kernel's time inside the whole
model (Relax VM instrumentation of a bytecode build of the same tuned module) next to
onnxruntime's per-node profile, grouped by kernel kind, with GFLOP/s and % of the measured
single-thread fp32 GEMM peak, and the time outside kernels as rows of their own.

    .venv/bin/python bench/profile_gap.py --model pplcnet-orientation --database WORKDIR/work/databases/bench-avx512
    .venv/bin/python bench/profile_gap.py --model pplcnet-orientation --layout NHWC --database ...

--database: a class's tuning database (e.g. of `side_by_side.py --keep-workdir`); without it the
untuned build is profiled. --layout: the layout the model's convolutions are compiled in (as
`models[].layout`, auto by default; side_by_side.py --ablate-layout tunes the NHWC twin in the same database). Runs
in this process on this machine, 1 thread for all (TVM, onnxruntime, OpenBLAS); writes
bench/results/profile_MODEL[-nhwc].{json,md}. A built artifact on a board of its class is
profiled by `edgetune profile MODEL --class CLASS` (kernels timed one by one there); this script
times each kernel inside whole model calls of a bytecode build, on the host.
"""

from __future__ import annotations

import os

for _variable in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_variable] = "1"  # before numpy / tvm / onnxruntime start their thread pools

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

import real_models  # noqa: E402
from _benchlib import PROFILE_AVX512, machine_facts, say  # noqa: E402
from board_side_by_side import gemm_gflops  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DISTORTION_LIMIT = 0.15  # instrumented vs plain model time beyond which the profile warns


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help=", ".join(m.name for m in real_models.MODELS) + f" (NAME{real_models.INT8_SUFFIX}: its int8 model, NHWC)",
    )
    parser.add_argument("--database", type=Path, help="tuning database directory (default: profile untuned)")
    parser.add_argument(
        "--layout",
        choices=("auto", "NCHW", "NHWC"),
        default="auto",
        help="models[].layout (default auto, as fleet.yaml's)",
    )
    parser.add_argument("--calls", type=int, default=30, help="profiled model calls per runtime (default 30)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import numpy as np
    import onnxruntime as ort
    import tvm
    import tvm.s_tir.meta_schedule as ms
    from tvm import relax

    from edgetune.artifact.profile import (
        profile_onnxruntime,
        profile_vm,
        tvm_kernel_kinds,
    )
    from edgetune.compiler.models import entry_function, import_model, reference_inputs
    from edgetune.compiler.prepare import (
        apply_database_and_build,
        count_tuned_tasks,
        prepare,
    )
    from edgetune.compiler.target import build_target
    from edgetune.inventory.loader import load_profile
    from edgetune.tune.database import ClassDatabasePaths, open_for_build

    int8 = args.model.endswith(real_models.INT8_SUFFIX)
    (real,) = real_models.by_name([args.model.removesuffix(real_models.INT8_SUFFIX)])
    path = real_models.fetch(real)
    if int8:  # onnxruntime's QDQ model of it, computed in integers (NHWC), as side_by_side.py times it
        path, args.layout = real_models.quantize(real, path, Path(tempfile.mkdtemp(prefix="edgetune-int8-"))), "NHWC"
    model = real.spec(path, args.layout, "integer" if int8 else "keep")
    target = build_target(load_profile(PROFILE_AVX512))
    imported = import_model(model)
    args.layout = imported.layout.layout
    say(f"{real.name}: layout {imported.layout.line}")
    prepared = prepare(imported.mod, target)
    records = open_for_build(ClassDatabasePaths(args.database)) if args.database else None  # as `edgetune build`
    database = records.database if records else ms.database.MemoryDatabase()
    coverage = count_tuned_tasks(prepared, database, target, records.kept_untuned if records else frozenset())
    say(f"{real.name}: building the bytecode VM ({coverage.tuned}/{coverage.total} kernels with a record)")
    vm = relax.VirtualMachine(apply_database_and_build(prepared, database, target, exec_mode="bytecode"), tvm.cpu())
    inputs = reference_inputs(model)
    tensors = [tvm.runtime.tensor(inputs[i.name]) for i in model.inputs]
    entry = entry_function(prepared)
    for _ in range(3):
        vm[entry](*tensors)
    gemm = gemm_gflops()
    say(f"profiling TVM: {args.calls} instrumented calls interleaved with {args.calls} plain ones")
    tvm_profile = profile_vm(vm, entry, tensors, tvm_kernel_kinds(prepared, args.layout), args.calls)

    say(f"profiling onnxruntime: {args.calls} calls")
    ort_profile = profile_onnxruntime(path, inputs, args.calls)
    ort_plain_ms = median_call_ms(single_thread_session(ort, path), inputs, args.calls)
    peak = max(gemm + gemm_gflops())  # the fastest call: other work on the machine only slows calls down

    report = {
        "model": args.model,
        "layout": args.layout,
        "kind": real.kind,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": machine_facts(),
        "database": str(args.database) if args.database else None,
        "kernels_with_record": [coverage.tuned, coverage.total],
        "peak_gflops": peak,
        "calls": args.calls,
        "tvm": _as_json(tvm_profile),
        "onnxruntime": _as_json(ort_profile),
        "onnxruntime_unprofiled_ms": ort_plain_ms,
        "versions": {"onnxruntime": ort.__version__, "tvm": tvm.__version__, "numpy": np.__version__},
    }
    args.results.mkdir(parents=True, exist_ok=True)
    stem = f"profile_{args.model}" + ("-nhwc" if args.layout == "NHWC" else "")
    (args.results / f"{stem}.json").write_text(json.dumps(report, indent=1))
    text = markdown(report, tvm_profile, ort_profile)
    (args.results / f"{stem}.md").write_text(text)
    print(text)


def single_thread_session(ort, path: Path):
    """An unprofiled onnxruntime session set up as `profile_onnxruntime`'s (1 thread, sequential)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def median_call_ms(session, inputs, calls: int) -> float:
    session.run(None, inputs)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        session.run(None, inputs)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e6


def _as_json(profile) -> dict:
    return {
        "model_ms": profile.model_ms,
        "kernels_ms": profile.kernels_ms,
        "builtins_ms": profile.builtins_ms,
        "outside_ms": profile.outside_ms,
        "kernels": [asdict(k) for k in profile.kernels],
    }


def _rest(ms: float) -> str:
    """The TVM call's time outside kernels and builtins; below zero when the instruments cost
    more than it (small models): shown as such, not as a negative time."""
    return f"{ms:.3f}" if ms >= 0 else f"~0 (the instrumented kernels and builtins exceed the call by {-ms:.3f})"


def _rate(ms: float, flops: int, peak: float) -> str:
    if not flops or ms <= 0:
        return "-"
    gflops = flops / ms / 1e6
    return f"{gflops:.1f} ({100 * gflops / peak:.0f} %)"


def checks(report: dict, tvm_profile, ort_profile) -> str:
    """How much the instruments themselves cost: on a small model with many short calls they
    distort the profile, and the rows should then only be compared within one runtime."""
    instrumented = tvm_profile.kernels_ms + tvm_profile.builtins_ms
    tvm_off = instrumented / tvm_profile.model_ms - 1
    ort_off = ort_profile.model_ms / report["onnxruntime_unprofiled_ms"] - 1
    text = (
        f"Checks: TVM's instrumented kernels + builtins sum to {instrumented:.3f} ms against "
        f"{tvm_profile.model_ms:.3f} ms uninstrumented ({100 * tvm_off:+.0f} %); onnxruntime's profiled run "
        f"takes {ort_profile.model_ms:.3f} ms against {report['onnxruntime_unprofiled_ms']:.3f} ms unprofiled "
        f"({100 * ort_off:+.0f} %)."
    )
    if max(abs(tvm_off), abs(ort_off)) > DISTORTION_LIMIT:
        text += (
            f" **More than {100 * DISTORTION_LIMIT:.0f} %: the instruments' own cost distorts this profile; "
            "compare kinds within one runtime, and the two runtimes with bench/side_by_side.py.**"
        )
    return text


def markdown(report: dict, tvm_profile, ort_profile) -> str:
    peak = report["peak_gflops"]
    tvm_kinds, ort_kinds = tvm_profile.by_kind(), ort_profile.by_kind()
    model_flops = sum(k.flops for k in tvm_profile.kernels)
    kinds = sorted(set(tvm_kinds) | set(ort_kinds), key=lambda k: -(tvm_kinds.get(k, (0, 0))[0]))
    lines = [
        f"# Profile: {report['model']} ({report['kind']}), TVM's convolutions {report['layout']}",
        "",
        f"{report['date_utc']} UTC; {report['machine']}; 1 thread for TVM, onnxruntime and OpenBLAS, in one "
        f"process on the host. TVM: {report['kernels_with_record'][0]}/{report['kernels_with_record'][1]} "
        f"kernels with a tuning record, bytecode VM (same kernels as the shipped compiled build), each kernel timed "
        f"by the VM instrument over {report['calls']} calls; the model time is the median of {report['calls']} "
        "uninstrumented calls interleaved with them. onnxruntime: SessionOptions.enable_profiling, default graph "
        f"optimizations, {report['calls']} runs after a warm-up run. Every time is a median over calls. Peak: numpy/OpenBLAS sgemm "
        f"1024^3, 1 thread, the fastest of 60 calls: {peak:.1f} GFLOP/s. FLOPs: convolutions and matmuls only (2 per multiply-add), "
        "counted on TVM's kernels and used for both columns of a kind.",
        "",
        "| kernel kind | TVM ms | TVM GFLOP/s (% peak) | onnxruntime ms | onnxruntime GFLOP/s (% peak) | TVM ms / onnxruntime ms |",
        "|---|---|---|---|---|---|",
    ]
    for kind in kinds:
        t_ms, t_flops = tvm_kinds.get(kind, (0.0, 0))
        o_ms = ort_kinds.get(kind, (0.0, 0))[0]
        ratio = f"{t_ms / o_ms:.2f}" if t_ms and o_ms else "-"
        lines.append(
            f"| {kind} | {t_ms:.3f} | {_rate(t_ms, t_flops, peak)} | {o_ms:.3f} | {_rate(o_ms, t_flops, peak)} | {ratio} |"
        )
    lines += [
        f"| outside kernels: VM builtins (allocation, shape checks, reshape) | {tvm_profile.builtins_ms:.3f} | | - | | |",
        f"| outside kernels: the rest (interpreter, calls, copies) | {_rest(tvm_profile.outside_ms - tvm_profile.builtins_ms)} "
        f"| | {ort_profile.outside_ms:.3f} | | |",
        f"| **model** | **{tvm_profile.model_ms:.3f}** | {_rate(tvm_profile.model_ms, model_flops, peak)} "
        f"| **{ort_profile.model_ms:.3f}** | {_rate(ort_profile.model_ms, model_flops, peak)} "
        f"| {tvm_profile.model_ms / ort_profile.model_ms:.2f} |",
        "",
        checks(report, tvm_profile, ort_profile),
        "",
        "Slowest TVM kernels inside the model:",
        "",
        "| kernel | kind | ms | GFLOP/s (% peak) |",
        "|---|---|---|---|",
    ]
    for kernel in tvm_profile.kernels[:12]:
        lines.append(f"| {kernel.name} | {kernel.kind} | {kernel.ms:.3f} | {_rate(kernel.ms, kernel.flops, peak)} |")
    lines += ["", "Slowest onnxruntime nodes:", "", "| node | kind | ms |", "|---|---|---|"]
    for kernel in ort_profile.kernels[:12]:
        lines.append(f"| {kernel.name} | {kernel.kind} | {kernel.ms:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
