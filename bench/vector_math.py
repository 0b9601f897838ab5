"""Question: how much faster are element-wise kernels whose math function edgetune legalizes
with its vector approximations (edgetune.compiler.relax.fast_math: exp, erf, tanh, log) than with TVM's
own legalization, which calls libm per lane (`erff`, `logf`, `expf`; TVM's tanh is built on
`expf`)? And how far from float64 NumPy are the approximations? Issue 29: a real model's GELU
epilogue computed `erff` per lane at 15-70 GFLOP/s.

How (speed): one Relax operator per row over a 1x64x56x56 float32 tensor (a GELU after a
64-channel convolution at 56x56), legalized both ways, each legalized kernel inlined into one
loop, vectorized by the target's vector width and compiled alike; 1 thread, on the host.
The two kernels are timed interleaved (ABAB), ROUNDS rounds of SAMPLES samples of >= 50 ms
each; per round the ratio of medians, then the median over rounds with a 95 % bootstrap
interval and the spread (fastest and slowest round). Outputs are checked against each other.

How (--tuned-conv N): a 3x3 convolution 64 -> 64 at 56x56 followed by GELU, legalized both ways
and fused (the GELU as the convolution's epilogue), tuned on the host with N trials each
(MetaSchedule, same seed), built, and the two builds timed interleaved as above; GFLOP/s count
the convolution's multiply-adds only.

How (accuracy, --accuracy): each element function, vectorized, over 400k float32 per sign and
range from the subnormals to 3e38, against float64 NumPy (`math.erf` for erf); the largest
error in ulp of the exact value. `--fit` prints the least-squares fits behind the coefficients.

    .venv/bin/python bench/vector_math.py [--mcpu x86-64-v3] [--rounds 9] [--tuned-conv 32] [--accuracy] [--fit]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tvm
from numpy.polynomial import Polynomial
from tvm import relax, te, tirx
from tvm.s_tir import meta_schedule as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import machine_facts, round_ratio, sample_seconds, say  # noqa: E402

from edgetune.compiler.relax import fast_math  # noqa: E402
from edgetune.tune.candidate_builder import make_builder  # noqa: E402

SHAPE = (1, 64, 56, 56)
CONV_WEIGHT = (64, 64, 3, 3)
VECTOR_WIDTH = {"x86-64-v2": 4, "x86-64-v3": 8}  # float32 lanes of SSE and AVX2 registers
OPERATORS = {  # row name: the Relax operator timed
    "gelu (erf)": relax.op.nn.gelu,
    "erf": relax.op.erf,
    "gelu_tanh": relax.op.nn.gelu_tanh,
    "tanh": relax.op.tanh,
    "log": relax.op.log,
    "exp": relax.op.exp,
}
ELEMENT_FUNCTIONS = {
    "exp": (fast_math.exp_element, np.exp),
    "erf": (fast_math.erf_element, np.vectorize(math.erf, otypes=[np.float64])),
    "tanh": (fast_math.tanh_element, np.tanh),
    "log": (fast_math.log_element, np.log),
}
ACCURACY_RANGES = [(1e-45, 1e-30), (1e-30, 1e-3), (1e-3, 0.5), (0.5, 1), (1, 2), (2, 4), (4, 80), (80, 3e38)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mcpu", default="x86-64-v3", choices=sorted(VECTOR_WIDTH), help="LLVM CPU (default x86-64-v3)"
    )
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--samples", type=int, default=3, help="samples per kernel and round (default 3)")
    parser.add_argument("--sample-ms", type=float, default=50.0, help="each sample loops this long (default 50)")
    parser.add_argument(
        "--tuned-conv", type=int, default=0, metavar="N", help="also conv + GELU tuned with N trials each"
    )
    parser.add_argument("--accuracy", action="store_true", help="measure the element functions' errors too")
    parser.add_argument("--fit", action="store_true", help="print the fitted coefficients and stop")
    return parser.parse_args()


def target(mcpu: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 1})


def one_loop_vectorized(func: tirx.PrimFunc, lanes: int) -> tvm.IRModule:
    """Every block of an element-wise PrimFunc inlined into its last, whose loops are fused,
    split by `lanes` and vectorized."""
    schedule = tvm.s_tir.Schedule(func)
    *producers, output = schedule.get_child_blocks(schedule.get_sblock("root"))
    for block in producers:
        schedule.compute_inline(block)
    fused = schedule.fuse(*schedule.get_loops(output))
    schedule.vectorize(schedule.split(fused, [None, lanes])[1])
    return schedule.mod


def legalized_kernel(op, fast: bool, mcpu: str):
    """The compiled kernel of `op` (called directly: Executable.__call__ costs 0.3 ms a call)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op(x)))
    legalize = fast_math.legalize_fast_math() if fast else relax.transform.LegalizeOps()
    (func,) = [f for f in legalize(bb.get()).functions.values() if isinstance(f, tirx.PrimFunc)]
    kernel = one_loop_vectorized(func.with_attr("global_symbol", "main"), VECTOR_WIDTH[mcpu])
    return tvm.compile(kernel, target=target(mcpu)).jit().main


def interleaved(libm_call, fast_call, args: argparse.Namespace) -> tuple[float, float, dict]:
    """Median seconds per call of each, and the libm/fast ratio over ABAB-interleaved rounds."""
    times: dict = {libm_call: [], fast_call: []}
    for _ in range(args.rounds):
        rounds = {libm_call: [], fast_call: []}
        for _ in range(args.samples):
            for call in rounds:  # ABAB
                rounds[call].append(sample_seconds(call, args.sample_ms))
        for call in rounds:
            times[call].append(rounds[call])
    median = {call: statistics.median(s for r in samples for s in r) for call, samples in times.items()}
    return median[libm_call], median[fast_call], round_ratio(times[libm_call], times[fast_call])


def ratio_text(ratio: dict) -> str:
    return (
        f"speed-up {ratio['median']:5.2f}x (95 % CI {ratio['ci95'][0]:.2f}-{ratio['ci95'][1]:.2f}, "
        f"rounds {min(ratio['per_round']):.2f}-{max(ratio['per_round']):.2f})"
    )


def compare_speed(name: str, op, args: argparse.Namespace) -> None:
    libm, fast = (legalized_kernel(op, flag, args.mcpu) for flag in (False, True))
    values = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32) * 3
    if name == "log":
        values = np.abs(values) + np.float32(1e-3)
    x = tvm.runtime.tensor(values)
    outputs = {kernel: tvm.runtime.tensor(np.empty(SHAPE, np.float32)) for kernel in (libm, fast)}
    for kernel, out in outputs.items():
        kernel(x, out)
    difference = float(np.max(np.abs(outputs[libm].numpy() - outputs[fast].numpy())))
    libm_s, fast_s, ratio = interleaved(lambda: libm(x, outputs[libm]), lambda: fast(x, outputs[fast]), args)
    per_element = 1e9 / math.prod(SHAPE)
    say(
        f"{name:11s} libm {libm_s * per_element:6.2f} ns/element  vector {fast_s * per_element:5.2f} ns/element  "
        f"{ratio_text(ratio)}  max |difference| {difference:.2g}"
    )


def conv_gelu(fast: bool, mcpu: str) -> tvm.IRModule:
    """conv 3x3 + GELU, legalized (fast or TVM's way) and fused, under the target."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    weight = relax.const(np.random.default_rng(0).standard_normal(CONV_WEIGHT).astype(np.float32) * 0.05)
    with bb.function("main", [x]):
        with bb.dataflow():  # FuseOps fuses only inside dataflow blocks
            y = bb.emit_output(relax.op.nn.gelu(relax.op.nn.conv2d(x, weight, padding=1)))
        bb.emit_func_output(y)
    legalize = fast_math.legalize_fast_math() if fast else relax.transform.LegalizeOps()
    with target(mcpu):
        return tvm.transform.Sequential([legalize, relax.get_pipeline("zero")])(bb.get())


def tuned_build(mod: tvm.IRModule, mcpu: str, trials: int, work_dir: str):
    """The VM entry of `mod` built with `trials` trials of host tuning."""
    tasks = ms.relax_integration.extract_tasks(mod, target(mcpu))
    contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir=work_dir, num_threads=1, seed=0)
    database = ms.database.MemoryDatabase()
    ms.tune.tune_tasks(
        tasks=contexts,
        task_weights=[1.0] * len(tasks),
        work_dir=work_dir,
        max_trials_global=trials * len(tasks),
        max_trials_per_task=trials,
        num_trials_per_iter=min(trials, 16),
        builder=make_builder(work_dir, None, 1),
        runner=ms.runner.LocalRunner(),
        database=database,
    )
    with target(mcpu), database:
        applied = relax.transform.MetaScheduleApplyDatabase(enable_warning=True)(mod)
    return relax.VirtualMachine(relax.build(applied, target=target(mcpu)), tvm.cpu())["main"]


def compare_tuned_conv(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as work:
        libm, fast = (
            tuned_build(conv_gelu(flag, args.mcpu), args.mcpu, args.tuned_conv, f"{work}/{flag}")
            for flag in (False, True)
        )
    x = tvm.runtime.tensor(np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32))
    difference = float(np.max(np.abs(libm(x).numpy() - fast(x).numpy())))
    libm_s, fast_s, ratio = interleaved(lambda: libm(x), lambda: fast(x), args)
    gflop = 2 * math.prod(CONV_WEIGHT) * SHAPE[2] * SHAPE[3] / 1e9
    say(
        f"conv 3x3 64->64 @56x56 + GELU, {args.tuned_conv} trials each: libm {gflop / libm_s:5.1f} GFLOP/s  "
        f"vector {gflop / fast_s:5.1f} GFLOP/s  {ratio_text(ratio)}  max |difference| {difference:.2g}"
    )


def element_kernel(element, mcpu: str, length: int) -> tvm.runtime.Module:
    x = te.placeholder((length,), "float32", name="x")
    y = te.compute(x.shape, lambda i: element(x[i]), name="y")
    return tvm.compile(one_loop_vectorized(te.create_prim_func([x, y]), VECTOR_WIDTH[mcpu]), target=target(mcpu))


def ulps_off(ours: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Error in ulp of the float32 nearest to `exact`, where that is finite."""
    nearest = exact.astype(np.float32)
    finite = np.isfinite(nearest)
    return np.abs(ours[finite].astype(np.float64) - exact[finite]) / np.spacing(np.abs(nearest[finite]))


def worst_error(name: str, mcpu: str, count: int = 400_000) -> float:
    element, exact = ELEMENT_FUNCTIONS[name]
    signs = (1.0,) if name == "log" else (1.0, -1.0)
    kernel, rng, worst = element_kernel(element, mcpu, count * len(signs)), np.random.default_rng(1), 0.0
    for low, high in ACCURACY_RANGES:
        magnitudes = np.exp(rng.uniform(math.log(low), math.log(high), count)).astype(np.float32)
        x = np.concatenate([sign * magnitudes for sign in signs]).astype(np.float32)
        out = tvm.runtime.tensor(np.empty_like(x))
        kernel(tvm.runtime.tensor(x), out)
        with np.errstate(all="ignore"):
            worst = max(worst, float(ulps_off(out.numpy(), exact(x.astype(np.float64))).max()))
    return worst


def chebyshev_fit(function, low: float, high: float, degree: int, variable=lambda x: x, checked_from: float = 0.0):
    """Least-squares polynomial in variable(x) through 4000 Chebyshev nodes of [low, high];
    its coefficients (lowest degree first) and largest relative error on a fine grid, skipping
    |x| < checked_from (where float64 evaluation of `function` itself cancels)."""
    k = np.arange(4000)
    nodes = (low + high) / 2 + (high - low) / 2 * np.cos(np.pi * (k + 0.5) / 4000)
    fit = Polynomial.fit(variable(nodes), function(nodes), degree).convert()
    grid = np.linspace(low, high, 200_001)
    grid = grid[np.abs(grid) >= checked_from]
    return [float(c) for c in fit.coef], float(np.max(np.abs(fit(variable(grid)) / function(grid) - 1)))


def erfc_tail_fit(degree: int = 14) -> tuple[list[float], float]:
    """erfc(x) on [1, 4] as a polynomial in u = (x - 2.5) / 1.5 (least squares through 4000
    Chebyshev nodes); its coefficients and largest absolute error (erf = 1 - erfc there, so the
    absolute error is what counts)."""
    erfc = np.vectorize(math.erfc)
    k = np.arange(4000)
    u = np.cos(np.pi * (k + 0.5) / 4000)
    fit = Polynomial.fit(u, erfc(2.5 + 1.5 * u), degree, domain=[-1, 1], window=[-1, 1])
    grid = np.linspace(-1.0, 1.0, 200_001)
    return [float(c) for c in fit.coef], float(np.max(np.abs(fit(grid) - erfc(2.5 + 1.5 * grid))))


def print_fits() -> None:
    erf = np.vectorize(math.erf)
    coefficients, error = erfc_tail_fit()
    print(f"ERFC_TAIL: absolute error {error:.2g}\n  {coefficients}")
    fits = {
        "ERF_NEAR_ZERO": (lambda x: erf(x) / x, 1e-9, 1.0, 6, lambda x: x * x, 0.0),
        "TANH_NEAR_ZERO": (lambda x: (np.tanh(x) / x - 1) / (x * x), 1e-4, 0.625, 4, lambda x: x * x, 0.0),
        "LOG1P_CUBIC_TERM": (
            lambda f: (np.log1p(f) - f + f * f / 2) / f**3,
            math.sqrt(0.5) - 1,
            math.sqrt(2) - 1,
            8,
            lambda f: f,
            1e-3,
        ),
    }
    for name, (function, low, high, degree, variable, checked_from) in fits.items():
        with np.errstate(all="ignore"):  # the log1p term is 0/0 at f = 0
            coefficients, error = chebyshev_fit(function, low, high, degree, variable, checked_from)
        print(f"{name}: relative error {error:.2g}\n  {coefficients}")


def main() -> None:
    args = parse_args()
    if args.fit:
        print_fits()
        return
    say(machine_facts())
    say(
        f"target llvm -mcpu={args.mcpu}, {VECTOR_WIDTH[args.mcpu]} lanes, 1 thread, {math.prod(SHAPE)} float32 per call; "
        f"{args.rounds} rounds x {args.samples} samples x >= {args.sample_ms:g} ms, interleaved"
    )
    for name, op in OPERATORS.items():
        compare_speed(name, op, args)
    if args.tuned_conv:
        compare_tuned_conv(args)
    if args.accuracy:
        for name in ELEMENT_FUNCTIONS:
            say(f"{name}: at most {worst_error(name, args.mcpu):.2f} ulp from float64 NumPy")


if __name__ == "__main__":
    main()
