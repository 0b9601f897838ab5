"""Question: on NHWC convolutions (pointwise 1x1 and regular KxK), does the micro-kernel rule
(edgetune.tune.schedule_rules.pointwise) reach more of the CPU's peak than stock MetaSchedule
with the same few trials?

How: real models (PP-LCNet document orientation, PP-OCR's text-direction classifier, YOLOv8n)
compiled NHWC for the x86-avx512 profile (1 thread); their rule-marked kernels picked by shape. Each kernel is tuned twice on this host with the same
search settings as the tuner (evolutionary search, rounds of 8, seed 0, fresh XGBoost model,
LocalRunner): once as `prepare` leaves it (marked for the rule) and once with the mark removed
(stock rules). The best schedules after 8 and after TRIALS trials are then built again and
timed interleaved (stock, rule, stock, rule, ...), ROUNDS rounds (each the fastest of 3
repeats of >= 50 ms), medians. The fp32 peak is
OpenBLAS sgemm 1024^3 (numpy, 1 thread, fastest of 30 calls), measured in the same run.

No fleet: runs on the host only, in a temporary directory it removes.

    .venv/bin/python bench/pointwise_kernel.py [--trials 24] [--rounds 11] [--shapes 14x14x256x256,40x40x64x64k3s1,...]

A shape is the kernel's input HxWxCINxCOUT, then kK and sS for a KxK convolution of stride S
(1x1 stride 1 when left out); the first model that has it gives the kernel.
"""

from __future__ import annotations

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import PROFILE_AVX512, say  # noqa: E402

from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.inventory.schema import Model, ModelInput  # noqa: E402
from edgetune.tune.candidate_builder import FastBuild, make_builder  # noqa: E402
from edgetune.tune.models import load_model  # noqa: E402
from edgetune.tune.prepare import extract_tasks, prepare  # noqa: E402
from edgetune.tune.schedule_rules.pointwise import RULE  # noqa: E402
from edgetune.tune.target import build_target  # noqa: E402
from edgetune.tune.tuner import SearchSettings  # noqa: E402

MODELS = ["pplcnet-orientation", "ppocr-cls", "yolov8n-320"]
SHAPES = ["14x14x256x256", "7x7x256x512", "28x28x128x128", "56x56x64x64"]
TRIALS_PER_ROUND = 8
FAILED_S = 1e9  # MetaSchedule records a candidate that failed to build or run as 1e10 s


def sgemm_peak_gflops(size: int = 1024, calls: int = 30) -> float:
    a, b = (np.random.default_rng(0).standard_normal((size, size)).astype("float32") for _ in range(2))
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


@dataclass(frozen=True)
class ConvShape:
    """A convolution kernel: its input's height, width, channels; output channels, kernel, stride."""

    height: int
    width: int
    channels_in: int
    channels_out: int
    kernel: int = 1
    stride: int = 1

    @classmethod
    def parse(cls, text: str) -> "ConvShape":
        match = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?:k(\d+)s(\d+))?", text)
        if match is None:
            raise SystemExit(f"--shapes: {text!r} is not HxWxCINxCOUT or HxWxCINxCOUTkKsS")
        return cls(*(int(g) for g in match.groups() if g is not None))

    def __str__(self) -> str:
        kernel = f" {self.kernel}x{self.kernel}/{self.stride}" if (self.kernel, self.stride) != (1, 1) else ""
        return f"{self.height}x{self.width}, {self.channels_in}->{self.channels_out}{kernel}"

    def flops(self) -> int:
        pixels = (self.height // self.stride) * (self.width // self.stride)
        return 2 * pixels * self.channels_out * self.kernel**2 * self.channels_in


def marked_tasks(target: tvm.target.Target, shapes: list[ConvShape]) -> dict[ConvShape, ms.ExtractedTask]:
    found = {}
    for real in real_models.by_name(MODELS):
        if len(found) == len(shapes):
            break
        model = Model(real.name, tuple(ModelInput(n, tuple(s), d) for n, s, d in real.inputs),
                      onnx=real_models.fetch(real), layout="NHWC")  # fmt: skip
        for task in extract_tasks(prepare(load_model(model), target), target):
            shape = _conv_shape(task.dispatched[0]["main"])
            if shape in shapes and shape not in found and RULE in task.dispatched[0].script():
                found[shape] = task
    return found


def _conv_shape(func: tvm.tirx.PrimFunc) -> ConvShape | None:
    shapes = [tuple(int(d) for d in p.shape) for p in func.params if hasattr(p, "shape")]
    if len(shapes) < 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4 or len(shapes[-1]) != 4:
        return None
    (_, height, width, channels_in), (channels_out, kernel, _, _), out_width = shapes[0], shapes[1], shapes[-1][2]
    return ConvShape(height, width, channels_in, channels_out, kernel, round(width / out_width))


def without_rule(mod: tvm.IRModule) -> tvm.IRModule:
    """The kernel as stock MetaSchedule schedules it: the rule's mark removed."""
    sch = tvm.s_tir.Schedule(mod)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if "schedule_rule" in sch.get(block).annotations:
            sch.unannotate(block, "schedule_rule")
    return sch.mod


def tune(mod: tvm.IRModule, target, trials: int, work: Path) -> list[ms.database.TuningRecord]:
    """The measured records of `trials` trials on this host, in the order they were measured."""
    search = SearchSettings()
    context = ms.TuneContext(
        mod=mod, target=target, space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=search.population_size, init_measured_ratio=search.init_measured_ratio,
            genetic_num_iters=search.genetic_num_iters),
        task_name="kernel", num_threads=1, rand_state=search.seed,
    )  # fmt: skip
    database = ms.database.MemoryDatabase()
    work.mkdir()
    ms.tune.tune_tasks(
        tasks=[context], task_weights=[1.0], work_dir=str(work), max_trials_global=trials,
        max_trials_per_task=trials, num_trials_per_iter=TRIALS_PER_ROUND,
        builder=make_builder(str(work), None, 1),
        runner=ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
            number=3, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)),
        database=database, cost_model=ms.cost_model.XGBModel(num_tuning_cores=1),
    )  # fmt: skip
    return [r for r in database.get_all_tuning_records() if r.run_secs]


def best_after(records: list[ms.database.TuningRecord], trials: int) -> ms.database.TuningRecord:
    return min(records[:trials], key=lambda r: float(np.mean([float(s) for s in r.run_secs])))


class Kernel:
    """A record's schedule built for this host, with random arguments, timed on demand."""

    def __init__(self, record: ms.database.TuningRecord, target) -> None:
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        built = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
        self.function = FastBuild()(sch.mod, target, None)
        rng = np.random.default_rng(0)
        self.args = [tvm.runtime.tensor(rng.standard_normal(tuple(int(d) for d in p.shape)).astype("float32"))
                     for p in built["main"].params]  # fmt: skip
        self.samples: list[float] = []

    def time_once(self) -> None:
        """One round's sample: the fastest of 3 repeats of >= 50 ms (a repeat that the other
        jobs of the machine preempted is dropped, the round still counts)."""
        timer = self.function.time_evaluator("main", tvm.cpu(), number=10, repeat=3, min_repeat_ms=50)
        self.samples.append(min(timer(*self.args).results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help="kernels as HxWxCINxCOUT[kKsS], comma-separated (default: %(default)s)")
    args = parser.parse_args()
    shapes = [ConvShape.parse(s) for s in args.shapes.split(",")]
    target = build_target(load_profile(PROFILE_AVX512))
    peak = sgemm_peak_gflops()
    say(f"target {target}; sgemm 1024^3 peak (OpenBLAS, 1 thread, best of 30): {peak:.1f} GFLOP/s")
    tasks = marked_tasks(target, shapes)
    say(f"kernels found: {', '.join(map(str, tasks))}; not found: {[str(s) for s in shapes if s not in tasks]}")
    work = Path(tempfile.mkdtemp(prefix="pointwise-kernel-"))
    rows = []
    try:
        for index, (shape, task) in enumerate(tasks.items()):
            marked = task.dispatched[0]
            records = {}
            for arm, mod in (("stock", without_rule(marked)), ("rule", marked)):
                started = time.time()
                records[arm] = tune(mod, target, args.trials, work / f"{index}-{arm}")
                failed = sum(min(float(s) for s in r.run_secs) >= FAILED_S for r in records[arm])
                say(f"{shape} {arm}: {len(records[arm])} trials ({failed} failed) in {time.time() - started:.0f} s")
            for trials in sorted({TRIALS_PER_ROUND, args.trials}):
                kernels = {arm: Kernel(best_after(records[arm], trials), target) for arm in records}
                for _ in range(args.rounds):  # interleaved: stock, rule, stock, rule, ...
                    for kernel in kernels.values():
                        kernel.time_once()
                rows.append((shape, trials, kernels))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak_after = sgemm_peak_gflops()
    print_table(rows, peak, peak_after)


def print_table(rows, peak: float, peak_after: float) -> None:
    say(f"sgemm peak again after the kernels: {peak_after:.1f} GFLOP/s")
    print("\nms: median of the interleaved rounds (spread: (max - min) / median); % of the first peak; "
          "best: fastest round")
    print("\n| kernel (input HxW, Cin->Cout, KxK/stride) | trials | stock ms | rule ms | stock % peak | rule % peak "
          "| stock/rule | best: stock % / rule % |")
    print("|---|---|---|---|---|---|---|---|")
    for shape, trials, kernels in rows:
        flops = shape.flops()
        median = {arm: statistics.median(k.samples) for arm, k in kernels.items()}
        spread = {arm: (max(k.samples) - min(k.samples)) / median[arm] for arm, k in kernels.items()}
        percent = {arm: 100 * flops / median[arm] / 1e9 / peak for arm in median}
        best = {arm: 100 * flops / min(k.samples) / 1e9 / peak for arm, k in kernels.items()}
        print(f"| {shape} | {trials} | {median['stock'] * 1e3:.3f} (±{spread['stock']:.0%}) "
              f"| {median['rule'] * 1e3:.3f} (±{spread['rule']:.0%}) | {percent['stock']:.0f} % | {percent['rule']:.0f} % "
              f"| {median['stock'] / median['rule']:.2f} | {best['stock']:.0f} % / {best['rule']:.0f} % |")  # fmt: skip


if __name__ == "__main__":
    main()
