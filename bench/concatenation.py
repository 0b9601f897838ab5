"""Question: what does scheduling the kernels that concatenate along their innermost axis
(edgetune.compiler.concatenation: the channel loop partitioned at the concatenation's
boundaries, each part vectorized) gain over the schedule MetaSchedule's stock rules give them,
kernel by kernel, on YOLOv8n (float32 and onnxruntime's int8 QDQ file, NHWC)?

How: each model prepared twice, as `prepare` does and with the scheduling left out (the
ablation); for every kernel `prepare` scheduled, the stock candidate is the first design
space of MetaSchedule's default rules for the target (post-order-apply, postprocessors
applied; for these kernels the space has this one candidate: YOLOv8n int8's tuned records of
them each held one trial, "end of search space"). Both compiled for the host (1 thread, the
bench's AVX-512 profile), fed the same random inputs (their outputs compared), timed
interleaved: ROUNDS rounds of SAMPLES samples of >= 20 ms each, the order alternating; per
kernel the median of per-round ratios of medians with a 95 % bootstrap interval, and the sum
of the kernels' medians (each called once per inference in these models).

    .venv/bin/python bench/concatenation.py [--models yolov8n-320 yolov8n-320-int8] [--rounds 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import tvm
import tvm.s_tir.meta_schedule as ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402
from _benchlib import PROFILE_AVX512, machine_facts, round_ratio, sample_seconds, say  # noqa: E402

import edgetune.compiler.prepare as prepare_module  # noqa: E402
from edgetune.compiler.models import import_model  # noqa: E402
from edgetune.compiler.schedule_rules.common import is_scheduled  # noqa: E402
from edgetune.compiler.target import build_target  # noqa: E402
from edgetune.inventory.loader import load_profile  # noqa: E402

SAMPLES = 5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["yolov8n-320", "yolov8n-320-int8"])
    parser.add_argument("--rounds", type=int, default=10)
    return parser.parse_args()


def prepared_both_ways(name: str, target: tvm.target.Target, step: str = "schedule_concatenations"):
    """(the model's spec, as `prepare` makes it, as it makes it without `step`: one of its
    scheduling passes) for a real model's name (NAME-int8: its QDQ file, `integer`), NHWC."""
    int8 = name.endswith(real_models.INT8_SUFFIX)
    (real,) = real_models.by_name([name.removesuffix(real_models.INT8_SUFFIX)])
    path = real_models.fetch(real)
    if int8:
        path = real_models.quantize(real, path, Path(tempfile.mkdtemp(prefix="edgetune-int8-")))
    spec = real.spec(path, "NHWC", "integer" if int8 else "keep")
    mod = import_model(spec).mod
    scheduled = prepare_module.prepare(mod, target)
    with mock.patch.object(prepare_module, step, lambda mod, _target: mod):
        stock = prepare_module.prepare(mod, target)
    return spec, scheduled, stock


def stock_candidate(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> tvm.IRModule:
    context = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target, space_generator="post-order-apply",
                             search_strategy="evolutionary", task_name="stock", rand_state=1)  # fmt: skip
    space = context.generate_design_space()[0]
    for postproc in context.space_generator.postprocs:
        assert postproc.apply(space), f"a stock postprocessor refused the candidate: {postproc}"
    return space.mod


def arguments(func: tvm.tirx.PrimFunc, seed: int) -> list:
    rng = np.random.default_rng(seed)
    values = []
    for info in ms.arg_info.ArgInfo.from_prim_func(func):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        value = rng.integers(0, 256, shape) if dtype == "uint8" else rng.standard_normal(shape)
        values.append(tvm.runtime.tensor(value.astype(dtype)))
    return values


def compare(name: str, stock_func, scheduled_func, target, rounds: int) -> tuple[float, float, dict]:
    stock_func, scheduled_func = (f.with_attr("global_symbol", "main") for f in (stock_func, scheduled_func))  # Relax's are private
    built = {"stock": tvm.compile(stock_candidate(stock_func, target), target=target),
             "scheduled": tvm.compile(tvm.IRModule({"main": scheduled_func}), target=target)}  # fmt: skip
    outputs = {}
    for how, lib in built.items():
        args = arguments(stock_func, seed=1)
        lib["main"](*args)
        outputs[how] = args[-1].numpy()
    if not np.array_equal(outputs["stock"], outputs["scheduled"]):
        raise SystemExit(f"{name}: the scheduled kernel writes other values than the stock one")
    args = arguments(stock_func, seed=2)
    calls = {how: (lambda lib=lib: lib["main"](*args)) for how, lib in built.items()}
    samples = {how: [] for how in built}
    for index in range(rounds):
        for how in built if index % 2 == 0 else reversed(list(built)):
            samples[how].append([sample_seconds(calls[how], 20) for _ in range(SAMPLES)])
    medians = {how: float(np.median([s for r in rs for s in r])) * 1e3 for how, rs in samples.items()}
    return medians["stock"], medians["scheduled"], round_ratio(samples["stock"], samples["scheduled"])


def main() -> None:
    args = parse_args()
    target = build_target(load_profile(PROFILE_AVX512))
    say(machine_facts())
    for name in args.models:
        _, scheduled, stock = prepared_both_ways(name, target)
        stock_names = {g.name_hint for g in stock.get_global_vars()}
        kernels = [gv.name_hint for gv, f in scheduled.functions_items()
                   if "concatenate" in gv.name_hint and is_scheduled(f) and gv.name_hint in stock_names]
        say(f"{name}: {len(kernels)} kernels scheduled by prepare")
        total_stock = total_scheduled = 0.0
        print("| kernel | stock ms | scheduled ms | stock / scheduled [95 %] |\n|---|---|---|---|")
        for kernel in kernels:
            stock_ms, scheduled_ms, ratio = compare(kernel, stock[kernel], scheduled[kernel], target, args.rounds)
            total_stock, total_scheduled = total_stock + stock_ms, total_scheduled + scheduled_ms
            low, high = ratio["ci95"]
            short = kernel if len(kernel) < 60 else f"{kernel[:28]}...{kernel[-28:]}"
            print(f"| {short} | {stock_ms:.4f} | {scheduled_ms:.4f} | {ratio['median']:.2f}x [{low:.2f}-{high:.2f}] |", flush=True)
        print(f"| **sum** | **{total_stock:.3f}** | **{total_scheduled:.3f}** | {total_stock / max(total_scheduled, 1e-9):.2f}x |\n")


if __name__ == "__main__":
    main()
