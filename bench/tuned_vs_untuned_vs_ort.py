"""Tuned vs untuned TVM vs onnxruntime, all timed on one simulated board of one device class.

What it does, through edgetune's own library:
1. writes a small CNN as a real ONNX model (onnx.helper, fixed-seed weights) and takes the
   built-in `mobilenet-mini` (plus an ONNX mirror of it with the very same weights, so that
   onnxruntime can run it; the mirror's outputs are checked against edgetune's reference);
2. brings up its own 1-class simulated fleet (2 boards, cpu quota 1.0 each, profile
   device_profiles/x86-avx512.yaml) with `sim_up` + `fleet_up`;
3. tunes both models for the class with `tune_fleet` (budget: --trials per model, fresh database);
4. builds the tuned and the untuned library of each model with `prepare` +
   `apply_database_and_build` / `build_untuned` and exports them like the artifact release does;
5. times, on board 1, through the tracker (`run_on_boards`; it drives both boards of the class,
   one after the other, and the table shows board 1): untuned and tuned TVM; over SSH inside
   the same board (its namespace and cgroup): onnxruntime in a python process
   (time.perf_counter loop), same input, same thread count. Untuned and tuned TVM share one
   block, interleaved like `edgetune build` times them; onnxruntime has its own; a pause
   between blocks, and the whole comparison is done twice (round 2 in reverse
   order);
6. prints a table, tears everything down (fleet down + sim down, always).

Run: .venv/bin/python bench/tuned_vs_untuned_vs_ort.py [--trials 96] [--repeats 15] [--keep-workdir]
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _benchlib import (
    MOBILENET_MINI_INPUT,
    ONNX_CNN_INPUT,
    PROFILE_AVX512,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    make_cnn_onnx,
    make_mobilenet_mini_onnx,
    run_onnx_on_host,
    running_fleet,
    say,
    stage_ort_files,
    time_ort_on_board,
    tune_or_stop,
    write_fleet_yaml,
)

CLASS = "bench-avx512"
PAUSE_S = 2.0
ROUNDS = 2
TVM_TURNS = 3  # interleaved turns of untuned and tuned within a TVM block
MIRROR_ATOL = 1e-4
MIRROR_RTOL = 1e-4


@dataclass
class Built:
    model: object  # edgetune Model
    entry: str
    args: list[np.ndarray]
    expected: list[np.ndarray]  # edgetune's reference output (onnxruntime / untuned host build)
    rounding_spread: float  # how far a correct output may lie from it (quantized models)
    libraries: dict[str, Path]  # "tuned" / "untuned" -> .so
    tasks_tuned: int
    tasks_total: int
    ort_model: Path | None  # what onnxruntime runs (None: no ONNX form)
    ort_note: str
    layout: str  # the layout its convolutions were compiled in, and why ("NHWC: ...")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=96, help="tuning trials per model (default 96)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per block (default 15)")
    parser.add_argument(
        "--min-repeat-ms",
        type=float,
        default=50.0,
        help="each repeat loops the model for at least this long (default 50)",
    )
    parser.add_argument("--trials-per-iter", type=int, default=8, help="trials per tuning round (default 8)")
    parser.add_argument("--max-trials-per-task", type=int, default=48, help="default 48")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="tuning.time_limit_s of the class (default: none; when it fires, edgetune's stop "
        "currently crashes MetaSchedule with 'Check failed: (!task->is_terminated)')",
    )
    parser.add_argument("--models", default="cnn,mobilenet-mini", help="comma list of cnn, mobilenet-mini")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the fleet's workdir (databases, libraries)")
    return parser.parse_args()


def main() -> None:
    bench_main("bench-tvo", parse_args(), run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet

    facts = machine_facts()
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    models = []
    if "cnn" in wanted:
        make_cnn_onnx(workdir / "cnn.onnx")
        name, shape = ONNX_CNN_INPUT
        models.append(
            {"name": "cnn", "onnx": "cnn.onnx", "inputs": [{"name": name, "shape": list(shape), "dtype": "float32"}]}
        )
    if "mobilenet-mini" in wanted:
        name, shape = MOBILENET_MINI_INPUT
        models.append(
            {
                "name": "mobilenet-mini",
                "builtin": "mobilenet-mini",
                "inputs": [{"name": name, "shape": list(shape), "dtype": "float32"}],
            }
        )
    if not models:
        raise SystemExit("--models: nothing to do (known: cnn, mobilenet-mini)")
    tuning = {
        "trials_per_class": args.trials * len(models),  # split by weight (all 1): --trials per model
        "trials_per_iter": args.trials_per_iter,
        "max_trials_per_task": args.max_trials_per_task,
    }
    if args.time_limit:
        tuning["time_limit_s"] = args.time_limit
    boards = [BoardSpec("tvo-1", CLASS, 1.0, 11), BoardSpec("tvo-2", CLASS, 1.0, 12)]
    fleet = load_fleet(write_fleet_yaml(workdir, "bench-tvo", {CLASS: PROFILE_AVX512}, boards, models, tuning))
    board = fleet.boards[0]
    profile = fleet.device_class(CLASS).profile
    threads = board.threads or profile.runtime_threads

    with running_fleet(fleet):
        tune_s, class_result = tune(fleet)
        built = [build(fleet, model, workdir) for model in fleet.models]
        results = measure(fleet, board, built, threads, args)

    print_report(args, facts, fleet, board, profile, threads, tune_s, class_result, built, results)


def tune(fleet, starters: Path | None = None):
    """Tune the class, seeded from the starter records in `starters` (none by default)."""
    from edgetune.tune.tuner import TuneOptions

    say(
        f"tuning class {CLASS}: {budget_text(fleet)} ({len(fleet.models)} models), on {len(fleet.boards_of(CLASS))} boards"
    )
    started = time.monotonic()
    result = tune_or_stop(fleet, TuneOptions(borrow=False, starters=starters is not None, starters_dir=starters))
    elapsed = time.monotonic() - started
    (class_result,) = result.classes
    if not class_result.ok:
        raise SystemExit(f"tuning failed: {class_result.error}")
    say(
        f"tuned: {class_result.trials_run} trials in {elapsed:.0f} s"
        + (f" (stopped: {class_result.stopped})" if class_result.stopped else "")
    )
    return elapsed, class_result


def budget_text(fleet) -> str:
    """The class's budget as its fleet.yaml sets it."""
    from edgetune.tune.budget import time_is_the_budget

    policy = fleet.tuning
    if time_is_the_budget(policy, CLASS):
        return (
            f"time limit {policy.time_limit_s:g} s per class run, no trial budget, rounds of {policy.trials_per_iter}"
        )
    rule, trials = policy.task_budget_rule(CLASS)
    return (
        f"{trials} trials per task" if rule == "per_task" else f"{trials} trials"
    ) + f", {policy.trials_per_iter} per round"


def build(fleet, model, workdir: Path, tuned: bool = True, bytecode: bool = False) -> Built:
    """Tuned (unless `tuned` is False) and untuned libraries, built and exported the way the
    artifact release does; with `bytecode`, also the tuned module under the bytecode VM
    ("tuned-bytecode", an ablation of `exec_mode="compiled"`)."""
    from edgetune.compiler.models import (
        entry_function,
        import_model,
        reference_inputs,
        reference_outputs,
        rounding_spread,
    )
    from edgetune.compiler.prepare import (
        apply_database_and_build,
        build_untuned,
        count_tuned_tasks,
        prepare,
    )
    from edgetune.compiler.target import build_target
    from edgetune.tune.candidate_builder import SharedLibraryExport
    from edgetune.tune.database import ClassDatabasePaths, open_for_build

    say(f"building {model.name}: tuned and untuned")
    profile = fleet.device_class(CLASS).profile
    target = build_target(profile)
    imported = import_model(model)
    mod = imported.mod
    prepared = prepare(mod, target)
    records = open_for_build(ClassDatabasePaths.of(fleet.workdir, CLASS))  # what `edgetune build` applies
    database = records.database
    coverage = count_tuned_tasks(prepared, database, target, records.kept_untuned)
    out = workdir / "libs" / model.name
    out.mkdir(parents=True, exist_ok=True)
    export = SharedLibraryExport(str(out), profile.cross_compiler)
    libraries = {
        "untuned": Path(export(build_untuned(prepared, target))),
    }
    if tuned:
        libraries["tuned"] = Path(export(apply_database_and_build(prepared, database, target)))
    if tuned and bytecode:
        libraries["tuned-bytecode"] = Path(export(apply_database_and_build(prepared, database, target, "bytecode")))
    inputs = reference_inputs(model)
    expected = reference_outputs(model, inputs)
    if model.onnx is not None:
        ort_model, note = model.onnx, "the ONNX model itself"
    else:
        mirror = make_mobilenet_mini_onnx(workdir / f"{model.name}.mirror.onnx", model)
        got = run_onnx_on_host(mirror, inputs)
        diff = max(float(np.max(np.abs(g - e))) for g, e in zip(got, expected))
        ok = all(np.allclose(g, e, rtol=MIRROR_RTOL, atol=MIRROR_ATOL) for g, e in zip(got, expected))
        ort_model = mirror if ok else None
        note = (
            f"ONNX mirror of the built-in, same weights; host check vs edgetune's reference: "
            f"max |diff| {diff:.2g} ({'ok' if ok else 'MISMATCH: onnxruntime not timed'})"
        )
    return Built(
        model,
        entry_function(mod),
        [inputs[i.name] for i in model.inputs],
        expected,
        rounding_spread(model, inputs),
        libraries,
        coverage.tuned,
        coverage.total,
        ort_model,
        note,
        imported.layout.line,
    )


def measure(fleet, board, built: list[Built], threads: int, args) -> list[dict]:
    """Blocks on one board, a pause between blocks; round 2 runs the blocks in reverse order.
    The TVM block times untuned and tuned together, interleaved (`run_on_boards`, as
    `edgetune build` does); onnxruntime runs in a block of its own (its thread pool and TVM's
    must not share the cores)."""
    from edgetune.artifact.measure import run_on_boards
    from edgetune.fleet.tracker import rpc_endpoint
    from edgetune.inventory.schema import CompareSettings, Measurement

    endpoint = rpc_endpoint(fleet, CLASS)
    per_turn = max(1, -(-args.repeats // TVM_TURNS))  # about args.repeats samples per library in all
    measurement = Measurement(cooldown_ms=0, compare=CompareSettings(TVM_TURNS, per_turn, int(args.min_repeat_ms)))
    staged = {}
    for b in built:
        if b.ort_model is not None:
            staged[b.model.name] = stage_ort_files(
                board, b.ort_model, dict(zip([i.name for i in b.model.inputs], b.args)), b.model.name
            )
    rows = []
    for round_no in range(1, ROUNDS + 1):
        order = ["tvm", "onnxruntime"]
        if round_no % 2 == 0:
            order.reverse()
        for b in built:
            row = {"round": round_no, "model": b.model.name}
            for what in order:
                if what == "onnxruntime":
                    if b.model.name not in staged:
                        continue
                    remote_model, remote_npz = staged[b.model.name]
                    timing = time_ort_on_board(
                        board, remote_model, remote_npz, threads, args.repeats, args.min_repeat_ms
                    )
                    row["onnxruntime"] = timing.median_ms
                    row["ort_version"] = timing.version
                    row["ort_outputs"] = timing.outputs
                    say(f"round {round_no} {b.model.name:15s} onnxruntime {row['onnxruntime']:9.3f} ms")
                else:
                    # Every board of the class, not just `board`: board_sessions makes one tracker
                    # request per registered board and may be handed the same unwanted board twice
                    # (an unused server re-registers after ~5 s), so a subset can fail as "busy".
                    # Boards are driven one at a time; only `board`'s figures go in the table.
                    libraries = {"untuned": b.libraries["untuned"], "tuned": b.libraries["tuned"]}
                    runs = run_on_boards(endpoint, fleet.boards_of(CLASS), libraries, b.entry, b.args, measurement)
                    # run_on_boards does not close its RPC sessions: they close when garbage
                    # collected (reference cycles), and until then the boards stay "busy" for the
                    # tracker (up to the 600 s session timeout). Collect now.
                    gc.collect()
                    if board.name not in runs.succeeded:
                        raise SystemExit(f"{b.model.name} TVM on {board.name}: {runs.failed}")
                    for label, result in runs.succeeded[board.name].items():
                        for other, results in runs.succeeded.items():
                            if other != board.name:
                                row.setdefault("other_boards", {}).setdefault(label, {})[other] = results[
                                    label
                                ].timing.median_ms
                        row[label] = result.timing.median_ms
                        row[f"{label}_outputs"] = [result.outputs[k] for k in sorted(result.outputs)]
                        say(f"round {round_no} {b.model.name:15s} {label:11s} {row[label]:9.3f} ms")
                time.sleep(PAUSE_S)
            rows.append(row)
    return rows


def _max_diff(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> str:
    if not a or not b:
        return "-"
    return f"{max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b)):.2g}"


def print_report(args, facts, fleet, board, profile, threads, tune_s, class_result, built, rows) -> None:
    from tabulate import tabulate

    by_model = {b.model.name: b for b in built}
    summaries = {}
    for path in class_result.summaries:
        summary = json.loads(Path(path).read_text())
        summaries[summary["model"]] = summary
    table = []
    for row in rows:
        b = by_model[row["model"]]
        untuned, tuned, ort = row.get("untuned"), row.get("tuned"), row.get("onnxruntime")
        summary = summaries.get(row["model"], {})
        table.append(
            [
                row["round"],
                row["model"],
                f"{untuned:.3f}",
                f"{tuned:.3f}",
                f"{ort:.3f}" if ort else "n/a",
                f"{untuned / tuned:.1f}x",
                f"{ort / tuned:.2f}" if ort else "n/a",
                summary.get("trials", "?"),
                f"{b.tasks_tuned}/{b.tasks_total}",
            ]
        )
    headers = [
        "round",
        "model",
        "untuned ms",
        "tuned ms",
        "onnxruntime ms",
        "tuned/untuned speed-up",
        "tuned vs ORT (ORT ms / tuned ms)",
        "trials",
        "kernels with record",
    ]
    print()
    print("=" * 100)
    print(f"tuned vs untuned TVM vs onnxruntime, on simulated board {board.name} of class {CLASS}")
    print(f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine: {facts}, {load_now()}")
    print("=" * 100)
    print(tabulate(table, headers=headers, disable_numparse=True))
    print()
    print(
        "'tuned vs ORT' > 1: tuned TVM is faster than onnxruntime; < 1: slower. Times are medians of "
        f"about {args.repeats} repeats per block; each row is one round of blocks (TVM: untuned and tuned "
        f"interleaved in {TVM_TURNS} turns each; onnxruntime; round 2 in reverse order), with a pause between blocks."
    )
    print()
    print("output checks (max |diff|, reference input):")
    for b in built:
        tuned_out = next((r.get("tuned_outputs") for r in rows if r["model"] == b.model.name), None)
        ort_out = next(
            (r.get("ort_outputs") for r in rows if r["model"] == b.model.name and r.get("ort_outputs")), None
        )
        print(
            f"  {b.model.name}: tuned TVM on board vs edgetune reference {_max_diff(tuned_out, b.expected)}; "
            f"onnxruntime on board vs tuned TVM on board {_max_diff(ort_out, tuned_out)}; onnxruntime runs {b.ort_note}"
        )
    others = [
        f"round {r['round']} {r['model']} {what} {name} {ms:.3f} ms"
        for r in rows
        for what, per_board in r.get("other_boards", {}).items()
        for name, ms in per_board.items()
    ]
    if others:
        print("  TVM on the class's other board, same blocks (not in the table): " + "; ".join(others))
    ort_version = next((r["ort_version"] for r in rows if "ort_version" in r), "-")
    print()
    print("settings:")
    print(
        f"  fleet: 1 class ({CLASS}, profile {PROFILE_AVX512.relative_to(PROFILE_AVX512.parents[1])}, "
        f"target {profile.target_json()}), 2 simulated boards, cpu quota 1.0 each; timed on {board.name}"
    )
    print(
        f"  tuning: {fleet.tuning.trials_per_class} trials for the class ({args.trials} per model by weight), "
        f"{fleet.tuning.trials_per_iter} per round, at most {fleet.tuning.max_trials_per_task} per task, "
        f"time limit {f'{fleet.tuning.time_limit_s:g} s' if fleet.tuning.time_limit_s else 'none'}; spent {class_result.trials_run} trials in {tune_s:.0f} s"
        + (f"; stopped early: {class_result.stopped}" if class_result.stopped else "")
    )
    print(
        f"  timing: {threads} thread(s) for both (TVM_NUM_THREADS of the board's rpc_server; onnxruntime "
        f"intra_op_num_threads, sequential); about {args.repeats} repeats of >= {args.min_repeat_ms:g} ms per block "
        f"(TVM: {TVM_TURNS} interleaved turns per library); "
        f"{PAUSE_S:g} s pause between blocks; {ROUNDS} rounds"
    )
    print(
        "  TVM: relax.build(exec_mode='compiled'), weights pre-packed, run by the board's rpc_server through the "
        "tracker (time_evaluator of invoke_stateful)"
    )
    print(
        f"  onnxruntime {ort_version}: CPUExecutionProvider, default graph optimizations, python process started "
        "over SSH in the board's namespace and cgroup, time.perf_counter loop"
    )


if __name__ == "__main__":
    main()
