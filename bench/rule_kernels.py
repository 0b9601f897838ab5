"""Question: on NHWC convolutions, does a micro-kernel rule reach more of the CPU's peak than
stock MetaSchedule with the same few trials? `--kind convolution`: the rule of convolutions with
groups 1, pointwise 1x1 and regular KxK (edgetune.compiler.tir.convolution); `--kind
depthwise`: the depthwise rule (.depthwise).

How: real models (convolution: PP-LCNet document orientation, PP-OCR's text-direction classifier,
YOLOv8n, PP-OCR's text detector, ddddocr's detector; depthwise: PP-LCNet) compiled NHWC for the x86-avx512 profile (1 thread); their kernels
that the kind's rule marks, picked by shape. Each kernel is tuned twice on this host with the same
search settings as the tuner (evolutionary search, rounds of 8, seed 0, fresh XGBoost model,
LocalRunner): once as `prepare` leaves it (marked for the rule) and once with the mark removed
(stock rules). The best schedules after 8 and after TRIALS trials are then built again and
timed interleaved (stock, rule, stock, rule, ...), ROUNDS rounds (each the fastest of 3
repeats of >= 50 ms), medians. The fp32 peak is
OpenBLAS sgemm 1024^3 (numpy, 1 thread, fastest of 30 calls), measured in the same run.
Last, the whole model is built with the rule's best record for each kernel measured (the other
kernels untuned) and its output compared with onnxruntime's.

No fleet: runs on the host only, in a temporary directory it removes.

    .venv/bin/python bench/rule_kernels.py [--kind convolution|depthwise] [--trials 24] [--rounds 11] [--shapes ...]

Convolution shapes are the kernel's input HxWxCINxCOUT, then kK and sS for a KxK convolution of
stride S (1x1 stride 1 when left out); depthwise shapes are HxWxCxKxSTRIDE. The first model that
has a shape gives the kernel.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import PROFILE_AVX512, say  # noqa: E402

from edgetune.compiler.models import (  # noqa: E402
    entry_function,
    load_model,
    reference_inputs,
    reference_outputs,
)
from edgetune.compiler.prepare import apply_database_and_build, extract_tasks, prepare  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.compiler.tir import convolution, depthwise  # noqa: E402
from edgetune.compiler.tir.rules import register_schedule_rules  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402
from edgetune.inventory.schema import Model, ModelInput  # noqa: E402
from edgetune.tune.candidate_builder import FastBuild, make_builder  # noqa: E402
from edgetune.tune.tuner import SearchSettings  # noqa: E402


@dataclass(frozen=True)
class KernelKind:
    """A kind of convolution kernel a rule schedules: where it is found, how its shape is read and named."""

    rule: str
    models: tuple[str, ...]  # searched in this order for the shapes
    shape_format: str  # how --shapes spells one
    parse: Callable[[str], tuple[int, ...]]
    default_shapes: str  # as --shapes spells them
    shape_of: Callable[[list[tuple[int, ...]]], tuple[int, ...]]  # the kernel's buffer shapes -> its shape
    label: Callable[[tuple[int, ...]], str]  # for the table
    flops: Callable[[tuple[int, ...]], int]


def _parse_convolution(text: str) -> tuple[int, ...]:
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(?:k(\d+)s(\d+))?", text)
    if match is None:
        raise SystemExit(f"--shapes: {text!r} is not HxWxCINxCOUT or HxWxCINxCOUTkKsS")
    height, width, channels_in, channels_out, kernel, stride = match.groups()
    return int(height), int(width), int(channels_in), int(channels_out), int(kernel or 1), int(stride or 1)


def _parse_depthwise(text: str) -> tuple[int, ...]:
    if re.fullmatch(r"\d+x\d+x\d+x\d+x\d+", text) is None:
        raise SystemExit(f"--shapes: {text!r} is not HxWxCxKxSTRIDE")
    return tuple(int(d) for d in text.split("x"))


def _convolution_shape(buffers: list[tuple[int, ...]]) -> tuple[int, ...]:
    (_, height, width, channels_in), (channels_out, kernel, _, _), out_width = buffers[0], buffers[1], buffers[-1][2]
    return height, width, channels_in, channels_out, kernel, round(width / out_width)


def _convolution_label(s: tuple[int, ...]) -> str:
    kernel = f" {s[4]}x{s[4]}/{s[5]}" if (s[4], s[5]) != (1, 1) else ""
    return f"{s[0]}x{s[1]}, {s[2]}->{s[3]}{kernel}"


def _depthwise_shape(buffers: list[tuple[int, ...]]) -> tuple[int, ...]:
    (_, height, width, channels), (_, kernel, _, _), (_, out_height, _, _) = buffers[0], buffers[1], buffers[-1]
    return height, width, channels, kernel, height // out_height


KINDS = {
    "convolution": KernelKind(
        convolution.RULE,
        ("pplcnet-orientation", "ppocr-cls", "yolov8n-320", "ppocr-det", "ppocr-rec", "ddddocr-det"),
        "HxWxCINxCOUT[kKsS]",
        _parse_convolution,
        "14x14x256x256,7x7x256x512,28x28x128x128,56x56x64x64",
        _convolution_shape,
        _convolution_label,
        lambda s: 2 * (s[0] // s[5]) * (s[1] // s[5]) * s[3] * s[4] * s[4] * s[2],
    ),
    "depthwise": KernelKind(  # every depthwise kernel of PP-LCNet
        depthwise.RULE,
        ("pplcnet-orientation",),
        "HxWxCxKxSTRIDE",
        _parse_depthwise,
        "112x112x16x3x1,112x112x32x3x2,56x56x64x3x1,56x56x64x3x2,28x28x128x3x1,28x28x128x3x2,14x14x256x5x1,"
        "14x14x256x5x2,7x7x512x5x1",
        _depthwise_shape,
        lambda s: f"{s[0]}x{s[1]}x{s[2]}, {s[3]}x{s[3]} /{s[4]}",
        lambda s: 2 * (s[0] // s[4]) * (s[1] // s[4]) * s[2] * s[3] * s[3],
    ),
}
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
class Found:
    """A kernel found for a shape: the model it is in, that model prepared, and its task."""

    model: Model
    prepared: tvm.IRModule
    task: ms.ExtractedTask


def marked_tasks(target, kind: KernelKind, shapes) -> dict[tuple[int, ...], Found]:
    """The kernels that the kind's rule marked in its models, by shape, those in `shapes`."""
    found = {}
    for real in real_models.by_name(list(kind.models)):
        if len(found) == len(shapes):
            break
        model = Model(
            real.name,
            tuple(ModelInput(n, tuple(s), d) for n, s, d in real.inputs),
            onnx=real_models.fetch(real),
            layout="NHWC",
        )
        prepared = prepare(load_model(model), target)
        for task in extract_tasks(prepared, target):
            if kind.rule not in task.dispatched[0].script():
                continue
            buffers = [tuple(int(d) for d in p.shape) for p in task.dispatched[0]["main"].params]
            shape = kind.shape_of(buffers)
            if shape in shapes and shape not in found:
                found[shape] = Found(model, prepared, task)
    return found


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
    register_schedule_rules()
    context = ms.TuneContext(
        mod=mod,
        target=target,
        space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=search.population_for(TRIALS_PER_ROUND),
            init_measured_ratio=search.init_measured_ratio,
            genetic_num_iters=search.genetic_num_iters,
        ),
        task_name="kernel",
        num_threads=1,
        rand_state=search.seed,
    )
    database = ms.database.MemoryDatabase()
    work.mkdir()
    ms.tune.tune_tasks(
        tasks=[context],
        task_weights=[1.0],
        work_dir=str(work),
        max_trials_global=trials,
        max_trials_per_task=trials,
        num_trials_per_iter=TRIALS_PER_ROUND,
        builder=make_builder(str(work), None, 1),
        runner=ms.runner.LocalRunner(
            evaluator_config=ms.runner.EvaluatorConfig(
                number=3, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False
            )
        ),
        database=database,
        cost_model=ms.cost_model.XGBModel(num_tuning_cores=1),
    )
    return [r for r in database.get_all_tuning_records() if r.run_secs]


def best_after(records: list[ms.database.TuningRecord], trials: int) -> ms.database.TuningRecord:
    return min(records[:trials], key=lambda r: float(np.mean([float(s) for s in r.run_secs])))


def time_in_rounds(kernels: Mapping[str, Kernel], rounds: int) -> None:
    """A sample of every kernel per round, taking turns in the same order each round."""
    for _ in range(rounds):
        for kernel in kernels.values():
            kernel.time_once()


class Kernel:
    """A record's schedule built for this host, with random arguments, timed on demand."""

    def __init__(self, record: ms.database.TuningRecord, target) -> None:
        sch = tvm.s_tir.Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        built = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
        self.function = FastBuild()(sch.mod, target, None)
        rng = np.random.default_rng(0)
        self.args = [
            tvm.runtime.tensor(rng.standard_normal(tuple(int(d) for d in p.shape)).astype("float32"))
            for p in built["main"].params
        ]
        self.samples: list[float] = []

    def time_once(self) -> None:
        """One round's sample: the fastest of 3 repeats of >= 50 ms (a repeat that the other
        jobs of the machine preempted is dropped, the round still counts)."""
        timer = self.function.time_evaluator("main", tvm.cpu(), number=10, repeat=3, min_repeat_ms=50)
        self.samples.append(min(timer(*self.args).results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=sorted(KINDS), default="convolution")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument(
        "--shapes",
        help="kernels, comma-separated: "
        + "; ".join(f"{name} as {k.shape_format} (default {k.default_shapes})" for name, k in KINDS.items()),
    )
    args = parser.parse_args()
    kind = KINDS[args.kind]
    shapes = [kind.parse(s) for s in (args.shapes or kind.default_shapes).split(",")]
    target = build_target(load_profile(PROFILE_AVX512))
    peak = sgemm_peak_gflops()
    say(f"target {target}; sgemm 1024^3 peak (OpenBLAS, 1 thread, best of 30): {peak:.1f} GFLOP/s")
    tasks = marked_tasks(target, kind, shapes)
    missing = [s for s in shapes if s not in tasks]
    if missing:
        say(f"not marked for {kind.rule} (or not in {', '.join(kind.models)}): {missing}")
    work = Path(tempfile.mkdtemp(prefix=f"{args.kind}-kernel-"))
    rows, best_rule_records = [], {}
    try:
        for index, (shape, found) in enumerate(tasks.items()):
            marked = found.task.dispatched[0]
            records = {}
            for arm, mod in (("stock", without_rule(marked)), ("rule", marked)):
                started = time.time()
                records[arm] = tune(mod, target, args.trials, work / f"{index}-{arm}")
                failed = sum(min(float(s) for s in r.run_secs) >= FAILED_S for r in records[arm])
                say(f"{shape} {arm}: {len(records[arm])} trials ({failed} failed) in {time.time() - started:.0f} s")
            best_rule_records.setdefault(found.model.name, (found, []))[1].append(
                best_after(records["rule"], args.trials)
            )
            for trials in sorted({TRIALS_PER_ROUND, args.trials}):
                kernels = {arm: Kernel(best_after(records[arm], trials), target) for arm in records}
                time_in_rounds(kernels, args.rounds)  # interleaved: stock, rule, stock, rule, ...
                rows.append((shape, trials, kernels))
        for found, records in best_rule_records.values():
            check_against_onnxruntime(found.model, found.prepared, records, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak_after = sgemm_peak_gflops()
    print_table(kind, rows, peak, peak_after)


def check_against_onnxruntime(model: Model, prepared: tvm.IRModule, records, target) -> None:
    """The model built with the rule's records (other kernels untuned) answers what onnxruntime answers."""
    database = ms.database.MemoryDatabase()
    for record in records:
        database.commit_tuning_record(
            ms.database.TuningRecord(
                record.trace, database.commit_workload(record.workload.mod), record.run_secs, target, record.args_info
            )
        )
    vm = relax.VirtualMachine(apply_database_and_build(prepared, database, target), tvm.cpu())
    inputs = reference_inputs(model)
    got = vm[entry_function(prepared)](*[tvm.runtime.tensor(inputs[i.name]) for i in model.inputs])
    expected = reference_outputs(model, inputs)[0]
    got = (got[0] if isinstance(got, (list, tuple, tvm.ir.Array)) else got).numpy()
    error = float(np.abs(got - expected).max())
    say(
        f"{model.name} with the rule's {len(records)} kernels vs onnxruntime: max abs difference {error:.2e} "
        f"(outputs up to {float(np.abs(expected).max()):.2f}); allclose(rtol=1e-4, atol=1e-5): "
        f"{np.allclose(got, expected, rtol=1e-4, atol=1e-5)}"
    )


def print_table(kind: KernelKind, rows, peak: float, peak_after: float) -> None:
    say(f"sgemm peak again after the kernels: {peak_after:.1f} GFLOP/s")
    print(
        "\nms: median of the interleaved rounds (spread: (max - min) / median); % of the first peak; "
        "best: fastest round"
    )
    print(
        f"\n| kernel ({kind.shape_format}) | trials | stock ms | rule ms | stock % peak | rule % peak "
        "| stock/rule | best: stock % / rule % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for shape, trials, kernels in rows:
        flops = kind.flops(shape)
        median = {arm: statistics.median(k.samples) for arm, k in kernels.items()}
        spread = {arm: (max(k.samples) - min(k.samples)) / median[arm] for arm, k in kernels.items()}
        percent = {arm: 100 * flops / median[arm] / 1e9 / peak for arm in median}
        best = {arm: 100 * flops / min(k.samples) / 1e9 / peak for arm, k in kernels.items()}
        print(
            f"| {kind.label(shape)} | {trials} | {median['stock'] * 1e3:.3f} (±{spread['stock']:.0%}) "
            f"| {median['rule'] * 1e3:.3f} (±{spread['rule']:.0%}) | {percent['stock']:.0f} % | {percent['rule']:.0f} % "
            f"| {median['stock'] / median['rule']:.2f} | {best['stock']:.0f} % / {best['rule']:.0f} % |"
        )


if __name__ == "__main__":
    main()
