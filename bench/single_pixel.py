"""Question: what does scheduling the 1x1 convolutions of one pixel (squeeze-and-excitation;
edgetune.compiler.single_pixel) gain in whole models over building those kernels from what a
tuning database holds for them, and how many tuning tasks does it take off?

How: each model (NHWC) prepared twice, as `prepare` does and with the scheduling left out (the
ablation: those kernels are then tuning tasks, built from their best record or left
unscheduled where the class's boards measured that faster, as any build does). Both built
with the same class database (`--database`, e.g. a `side_by_side.py --keep-workdir` run's
WORKDIR/work/databases/bench-avx512; without one, both untuned) for the bench's AVX-512
profile, checked against onnxruntime on the model's reference inputs, and timed on the host,
1 thread, interleaved: ROUNDS rounds of 5 samples of >= 20 ms each, the order
alternating; the median of per-round ratios with a 95 % bootstrap interval. Where the database
was tuned with the scheduling on, the ablation's kernels have no record and run unscheduled.

    .venv/bin/python bench/single_pixel.py --database DIR [--models ppocr-cls pplcnet-orientation] [--rounds 10]
"""

from __future__ import annotations

import os

os.environ["TVM_NUM_THREADS"] = "1"  # before tvm starts its thread pool

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
import tvm.s_tir.meta_schedule as ms  # noqa: E402
from tvm import relax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _benchlib import (  # noqa: E402
    PROFILE_AVX512,
    machine_facts,
    max_diff,
    output_tolerance,
    round_ratio,
    run_onnx_on_host,
    say,
    time_alternating,
)
from concatenation import prepared_both_ways  # noqa: E402

from edgetune.compiler.models import entry_function, reference_inputs  # noqa: E402
from edgetune.compiler.prepare import apply_database_and_build, extract_tasks  # noqa: E402
from edgetune.compiler.schedule_rules.common import is_scheduled  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.tune.database import ClassDatabasePaths, open_for_build  # noqa: E402

STEP = "schedule_single_pixel_convolutions"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["ppocr-cls", "pplcnet-orientation", "ppocr-det", "ppocr-rec"])
    parser.add_argument("--database", type=Path, help="class tuning database directory (default: both untuned)")
    parser.add_argument("--rounds", type=int, default=10)
    return parser.parse_args()


def newly_scheduled(scheduled: tvm.IRModule, stock: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, func in scheduled.functions_items()
            if is_scheduled(func) and not is_scheduled(stock[gv.name_hint])]  # fmt: skip


def main() -> None:
    args = parse_args()
    target = build_target(load_profile(PROFILE_AVX512))
    database = open_for_build(ClassDatabasePaths(args.database)).database if args.database else ms.database.MemoryDatabase()
    say(machine_facts())
    say(f"database: {args.database or 'none (both untuned)'}")
    print("| model | kernels scheduled | tasks without -> with | without ms | with ms | without / with [95 %] | max diff from onnxruntime (tolerance) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        spec, scheduled, stock = prepared_both_ways(name, target, STEP)
        builds = {how: apply_database_and_build(mod, database, target) for how, mod in (("without", stock), ("with", scheduled))}
        found = compare_builds(spec, entry_function(scheduled), builds, args.rounds)
        low, high = found.ratio["ci95"]
        tasks = [len(extract_tasks(mod, target)) for mod in (stock, scheduled)]
        print(f"| {name} | {len(newly_scheduled(scheduled, stock))} | {tasks[0]} -> {tasks[1]} | {found.ms['without']:.4f} | "
              f"{found.ms['with']:.4f} | **{found.ratio['median']:.3f}x [{low:.3f}-{high:.3f}]** | "
              f"{found.max_diff:.2g} ({found.tolerance:.2g}) |", flush=True)  # fmt: skip


@dataclass(frozen=True)
class Comparison:
    ms: dict[str, float]  # each build's median ms per call
    ratio: dict  # `round_ratio` of the first build's times over the second's: > 1, the second is faster
    max_diff: float  # the larger of the builds' largest differences from onnxruntime's outputs
    tolerance: float


def compare_builds(spec, entry: str, builds: dict, rounds: int) -> Comparison:
    """Two builds of a model (name -> executable), checked against onnxruntime on the model's
    reference inputs (SystemExit beyond the tolerance) and timed on the host, interleaved."""
    inputs = reference_inputs(spec)
    expected = run_onnx_on_host(spec.onnx, inputs)
    feed = [tvm.runtime.tensor(inputs[i.name]) for i in spec.inputs]
    machines = {how: relax.VirtualMachine(executable, tvm.cpu()) for how, executable in builds.items()}
    diffs = {how: max_diff(expected, _outputs(vm[entry](*feed))) for how, vm in machines.items()}
    tolerance = output_tolerance(expected)
    if max(diffs.values()) > tolerance:
        raise SystemExit(f"{spec.name}: outputs {diffs} from onnxruntime's, beyond {tolerance:.2g}")
    samples = time_alternating({how: lambda vm=vm: vm[entry](*feed) for how, vm in machines.items()}, rounds)
    first, second = samples
    return Comparison({how: statistics.median(s for r in timed for s in r) * 1e3 for how, timed in samples.items()},
                      round_ratio(samples[first], samples[second]), max(diffs.values()), tolerance)


def _outputs(result) -> list[np.ndarray]:
    return [r.numpy() for r in result] if isinstance(result, (list, tuple, tvm.ir.Array)) else [result.numpy()]


if __name__ == "__main__":
    main()
