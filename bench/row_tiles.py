"""Question: on a row that only short register tiles divide, do longer tiles whose last one
computes under a predicate make the convolution rule's kernel faster?

How: each named model's first kernel of the convolution rule whose output row is `--width`
pixels wide is tuned on the host twice, `--trials` trials each, with the rule's design spaces
as `row_tiles` gives them ("longer": divisors and the longer tiles that leave at most 1/32 of
the row idle) and with the divisors alone ("divisors", as before the longer tiles). The best
record of each arm is built and timed in `--rounds` interleaved rounds (`rule_kernels.Kernel`:
the fastest of 3 repeats of >= 50 ms per round), one thread.

    .venv/bin/python bench/row_tiles.py [--kernels magika:508] [--trials 16] [--rounds 9]

No fleet: host only.
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS
os.environ["TVM_NUM_THREADS"] = "1"

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
import rule_kernels  # noqa: E402
from _benchlib import PROFILE_AVX512, say  # noqa: E402

from edgetune.compiler.models import load_model  # noqa: E402
from edgetune.compiler.prepare import extract_tasks, prepare  # noqa: E402
from edgetune.compiler.schedule_rules import common, convolution  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.inventory.schema import Model, ModelInput  # noqa: E402


def divisors_only(width: int, tail: bool = False) -> list[int]:
    """`row_tiles` without the longer tiles: a row some tile divides gets its divisors alone."""
    divisors = common.row_tiles(width)
    return divisors if divisors else common.row_tiles(width, tail)


def rule_kernel(name: str, width: int, target):
    (real,) = real_models.by_name([name])
    model = Model(real.name, tuple(ModelInput(n, tuple(s), d) for n, s, d in real.inputs),
                  onnx=real_models.fetch(real), layout="NHWC")  # fmt: skip
    for task in extract_tasks(prepare(load_model(model), target), target):
        kernel = task.dispatched[0]
        output = [int(d) for d in kernel["main"].params[-1].shape]
        if convolution.RULE in kernel.script() and output[2] == width:
            return task.task_name, kernel, output
    raise SystemExit(f"{name}: no kernel of {convolution.RULE} with rows of {width} pixels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="magika:508", help="MODEL:WIDTH, comma-separated")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    target = build_target(load_profile(PROFILE_AVX512))
    work = Path(tempfile.mkdtemp(prefix="row-tiles-"))
    rows = []
    try:
        for spec in args.kernels.split(","):
            name, width = spec.split(":")
            task_name, kernel, output = rule_kernel(name, int(width), target)
            kernels = {}
            for arm, tiles in (("divisors", divisors_only), ("longer", common.row_tiles)):
                convolution.row_tiles = tiles  # what the rule's design spaces read
                say(f"{name} {task_name} (output {output}) {arm}: tiles of {tiles(int(width), tail=True)} pixels")
                kernels[arm] = rule_kernels.tuned_kernel(kernel, target, args.trials, work / f"{task_name}-{arm}")
            convolution.row_tiles = common.row_tiles
            rule_kernels.time_in_rounds(kernels, args.rounds)
            rows.append((name, task_name, width, kernels))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| model | kernel | row | divisors ms | longer ms | divisors / longer |\n|---|---|---|---|---|---|")
    for name, task_name, width, kernels in rows:
        median = {arm: statistics.median(k.samples) * 1e3 for arm, k in kernels.items()}
        spread = {arm: (max(k.samples) - min(k.samples)) * 1e3 / median[arm] for arm, k in kernels.items()}
        print(f"| {name} | {task_name} | {width} | {median['divisors']:.3f} (±{spread['divisors']:.0%}) "
              f"| {median['longer']:.3f} (±{spread['longer']:.0%}) | {median['divisors'] / median['longer']:.2f} |")


if __name__ == "__main__":
    main()
