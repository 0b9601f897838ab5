"""Question: does every tuned kernel of a database compute what the same kernel computes
unscheduled? A whole model that answers wrong says that something is wrong; this says which kernel.

How: the real model is prepared as the tuner prepares it (x86-avx512 profile, `--layout`); for
each of its tasks with a record in `--database`, the best record's trace (postprocs included, as
the build applies it) is replayed on the task's kernel. Both the scheduled and the unscheduled
kernel are compiled and run on the host with the same random inputs (standard normal floats),
and the largest absolute difference of every buffer is compared with the bench's output
tolerance (`_benchlib.output_tolerance`: 1e-4 of that buffer's largest magnitude plus 1e-5).
Tasks without a record are listed, not checked. Exits non-zero if a kernel differs.

With `--time`, each kernel is also timed both ways on the host, one thread, interleaved (A B, B A,
... `--rounds` turns of `time_evaluator`, `min_repeat_ms` 20, 3 samples each): the median of
each side, and the kernels whose tuned schedule is slower than no schedule at all, weighted by
how often the model calls them.

    .venv/bin/python bench/check_kernels.py --model ppocr-det --layout NHWC --database DIR [--task NAME ...] [--time]

This is how ppocr-det's wrong transposed convolution was found (TVM 0.27's RewriteLayout; see
edgetune/compiler/prepack.py). No fleet: host only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import PROFILE_AVX512, max_diff, output_tolerance, say  # noqa: E402

from edgetune.compiler.models import load_model  # noqa: E402
from edgetune.compiler.prepare import extract_tasks, prepare  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.tune.database import ClassDatabasePaths, open_database  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help=", ".join(m.name for m in real_models.MODELS))
    parser.add_argument("--database", type=Path, required=True, help="tuning database directory")
    parser.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW", help="models[].layout (default NCHW)")
    parser.add_argument("--task", action="append", default=[], help="check only this task (repeatable)")
    parser.add_argument("--time", action="store_true", help="also time each kernel tuned and unscheduled")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved timing turns per side (with --time)")
    args = parser.parse_args()
    if args.time:
        os.environ["TVM_NUM_THREADS"] = "1"

    (real,) = real_models.by_name([args.model])
    model = real.spec(real_models.fetch(real), args.layout)  # its inputs' value ranges included
    target = build_target(load_profile(PROFILE_AVX512))
    database = open_database(ClassDatabasePaths(args.database))
    rng = np.random.default_rng(0)
    wrong, unrecorded, checked = [], [], 0
    timed: list[tuple[str, int, float, float]] = []  # (task, calls, untuned ms, tuned ms)
    for task in extract_tasks(prepare(load_model(model), target), target):
        if args.task and task.task_name not in args.task:
            continue
        kernel = task.dispatched[0]
        records = database.get_top_k(database.commit_workload(kernel), 1) if database.has_workload(kernel) else []
        if not records:
            unrecorded.append(task.task_name)
            continue
        scheduled = tvm.s_tir.Schedule(kernel)
        records[0].trace.apply_to_schedule(scheduled, remove_postproc=False)
        inputs = [random_tensor(rng, param) for param in kernel["main"].params]
        expected, got = run(kernel, inputs, target), run(scheduled.mod, inputs, target)
        differences = [difference(e, g) for e, g in zip(expected, got)]
        checked += 1
        worst = max(differences, key=lambda d: d[0] / d[1])
        verdict = "WRONG" if worst[0] > worst[1] else "ok"
        print(f"{task.task_name}: max |diff| {worst[0]:.3g} (tolerance {worst[1]:.3g}) {verdict}", flush=True)
        if verdict == "WRONG":
            wrong.append(task.task_name)
        if args.time:
            untuned_ms, tuned_ms = time_both(kernel, scheduled.mod, inputs, target, args.rounds)
            timed.append((task.task_name, task.weight, untuned_ms, tuned_ms))
            print(f"  untuned {untuned_ms:.4f} ms, tuned {tuned_ms:.4f} ms, x{task.weight}", flush=True)
    say(
        f"{checked} kernels checked, {len(wrong)} wrong"
        + (f": {', '.join(wrong)}" if wrong else "")
        + (f"; {len(unrecorded)} without a record: {', '.join(unrecorded)}" if unrecorded else "")
    )
    if timed:
        report_times(timed)
    return 1 if wrong else 0


def time_both(
    untuned: tvm.IRModule, tuned: tvm.IRModule, inputs: list[np.ndarray], target: tvm.target.Target, rounds: int
) -> tuple[float, float]:
    """Median ms of one call of each kernel, timed in turns A B, B A, ..."""
    tensors = [tvm.runtime.tensor(array) for array in inputs]
    timers = [
        tvm.compile(mod, target=target).mod.time_evaluator("main", tvm.cpu(), repeat=3, min_repeat_ms=20)
        for mod in (untuned, tuned)
    ]
    samples: list[list[float]] = [[], []]
    for turn in range(rounds):
        for side in (0, 1) if turn % 2 == 0 else (1, 0):
            samples[side].extend(timers[side](*tensors).results)
    return statistics.median(samples[0]) * 1e3, statistics.median(samples[1]) * 1e3


def report_times(timed: list[tuple[str, int, float, float]]) -> None:
    untuned_total = sum(calls * u for _, calls, u, _ in timed)
    tuned_total = sum(calls * t for _, calls, _, t in timed)
    slower = [(name, calls, u, t) for name, calls, u, t in timed if t > u]
    kept = sum(calls * (t - u) for _, calls, u, t in slower)
    say(
        f"kernels, each call counted: untuned {untuned_total:.3f} ms, tuned {tuned_total:.3f} ms; "
        f"{len(slower)} tuned kernels slower than unscheduled, {kept:.3f} ms in all "
        f"({kept / tuned_total:.1%} of the tuned kernels' time)"
    )
    for name, calls, u, t in sorted(slower, key=lambda row: row[1] * (row[2] - row[3])):
        print(f"  {name}: untuned {u:.4f} ms, tuned {t:.4f} ms, x{calls}")


def random_tensor(rng: np.random.Generator, param) -> np.ndarray:
    shape, dtype = [int(d) for d in param.shape], str(param.dtype)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 2, shape).astype(dtype)
    return np.zeros(shape, dtype)


def run(kernel: tvm.IRModule, inputs: list[np.ndarray], target: tvm.target.Target) -> list[np.ndarray]:
    """All the kernel's buffers after one call (outputs are written in place)."""
    tensors = [tvm.runtime.tensor(array) for array in inputs]
    tvm.compile(kernel, target=target)["main"](*tensors)
    return [tensor.numpy() for tensor in tensors]


def difference(expected: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(max |diff|, tolerance) of one buffer (an empty one differs by nothing)."""
    if expected.size == 0:
        return 0.0, 1.0
    return max_diff([expected], [got]), output_tolerance([expected])


if __name__ == "__main__":
    sys.exit(main())
