"""Shared pieces of the bench scripts: a locked simulated fleet of their own, the ONNX models
they tune, and onnxruntime timed on a board over SSH.

Every bench uses the bridge `etune-bench`, subnet 10.231.30.0/24 and tracker ports 9490-9499,
distinct from the default fleet (etune-br0, 10.231.7.0/24, 9190) and from the test slots
(etune-tN, 10.231.9+N.0/24, 9290+10N). Only one bench runs at a time on a machine: they hold
/tmp/edgetune-bench.lock while their fleet exists. EDGETUNE_BENCH_SLOT=N (1-9) moves a bench
to etune-benchN, 10.231.(30+N).0/24, ports 9490+10N.. and /tmp/edgetune-benchN.lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
# EDGETUNE_BENCH_SLOT=N (1-9) gives a bench its own bridge, subnet, tracker ports and lock, so
# two benches can run at once (their timings then share the cores: say so next to the numbers).
SLOT = int(os.environ.get("EDGETUNE_BENCH_SLOT", "0"))
if not 0 <= SLOT <= 9:
    sys.exit(f"EDGETUNE_BENCH_SLOT={SLOT}: allowed 0-9")
BRIDGE = "etune-bench" + (str(SLOT) if SLOT else "")
SUBNET = f"10.231.{30 + SLOT}"
TRACKER_PORT = 9490 + 10 * SLOT
LOCK_FILE = Path(f"/tmp/edgetune-bench{SLOT or ''}.lock")
PROFILE_AVX512 = REPO / "device_profiles" / "x86-avx512.yaml"

ONNX_CNN_INPUT = ("x", (1, 16, 32, 32))
MOBILENET_MINI_INPUT = ("image", (1, 3, 64, 64))
BOOTSTRAP_DRAWS = 2000


def output_tolerance(expected: Sequence[np.ndarray], rounding_spread: float = 0.0) -> float:
    """How far a build's outputs may be from the reference: the artifact check's tolerance
    (`edgetune.artifact_format.reference.output_tolerance`, wider for quantized models), its rtol
    taken of the reference's largest magnitude (a detector's box coordinates go up to its
    image size)."""
    from edgetune.artifact_format.reference import (
        output_tolerance as artifact_tolerance,
    )

    tolerance = artifact_tolerance(rounding_spread)
    return tolerance.atol + tolerance.rtol * max(float(np.max(np.abs(e))) for e in expected)


def max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b))


def round_ratio(numerator: list[list[int]], denominator: list[list[int]]) -> dict:
    """Per round: median(numerator) / median(denominator) of that round's calls; the median of
    those, with a 95 % bootstrap interval over rounds. > 1: the denominator is faster."""
    per_round = [statistics.median(a) / statistics.median(b) for a, b in zip(numerator, denominator)]
    rng = random.Random(0)
    draws = sorted(statistics.median(rng.choices(per_round, k=len(per_round))) for _ in range(BOOTSTRAP_DRAWS))
    return {
        "median": statistics.median(per_round),
        "ci95": [draws[int(0.025 * BOOTSTRAP_DRAWS)], draws[int(0.975 * BOOTSTRAP_DRAWS) - 1]],
        "per_round": per_round,
    }


def sample_seconds(run, sample_ms: float) -> float:
    """Mean seconds per call of a loop of at least `sample_ms`."""
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < sample_ms / 1e3 or calls == 0:
        run()
        calls += 1
    return elapsed / calls


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- process and machine state


def tune_or_stop(fleet, options):
    """`tune_fleet`; a SIGTERM or Ctrl-C during it ends the tuning after its rounds in flight
    (`edgetune.tune.stop`) and then the bench, through the same clean-up path."""
    from edgetune.tune import stop_requested, tune_fleet

    result = tune_fleet(fleet, options)
    if stop_requested():
        raise SystemExit("stopped during tuning (the tuning database keeps every measured trial)")
    return result


def quiet_xgboost_save_warning() -> None:
    """The tuner's class processes print XGBoost's 'Saving model in the UBJSON format' warning
    after every batch; silence that one (spawned processes inherit the environment)."""
    entry = "ignore::UserWarning:tvm.s_tir.meta_schedule.cost_model.xgb_model"
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), entry]))


@contextlib.contextmanager
def bench_lock() -> Iterator[None]:
    """Hold the machine-wide bench lock; refuse to start over a bridge left by a killed run."""
    handle = open(LOCK_FILE, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        sys.exit(f"another bench holds {LOCK_FILE} (its fleet uses {BRIDGE}); wait for it to finish")
    try:
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            sys.exit(
                f"interface {BRIDGE} exists but no bench is running: a killed bench left its fleet. "
                f"Remove it with `.venv/bin/python -m edgetune sim down -f WORKDIR/fleet.yaml` "
                "(WORKDIR is printed at the start of every bench run)"
            )
        yield
    finally:
        handle.close()


def make_workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"edgetune-{prefix}-"))


def remove_workdir(workdir: Path, keep: bool) -> None:
    if keep:
        say(f"workdir kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def bench_main(prefix: str, args, run) -> None:
    """What every bench does around its `run(args, workdir)`: one bench at a time, a fresh
    workdir (kept with --keep-workdir), SIGTERM and Ctrl-C through the same clean-up path."""
    from edgetune.tune import stop_on_signals

    quiet_xgboost_save_warning()
    started = time.monotonic()
    with stop_on_signals(), bench_lock():
        workdir = make_workdir(prefix)
        say(f"workdir {workdir}")
        try:
            run(args, workdir)
        finally:
            remove_workdir(workdir, args.keep_workdir)
    say(f"bench finished in {time.monotonic() - started:.0f} s")


VECTOR_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def machine_facts() -> str:
    """The cores, the CPU (its name, family and model, and the vector features that decide which
    kernels it runs: machines of the same kind here have been Intel and AMD) and the load."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = [f for f in fields.get("flags", "").split() if f in VECTOR_FEATURES]
    cpu = f"{fields.get('model name', '?')}, family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    load = Path("/proc/loadavg").read_text().split()[:3]
    return f"{os.cpu_count()} cores ({cpu}; {' '.join(flags)}), load average {' '.join(load)} at start"


def load_now() -> str:
    return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3]) + " at the end"


# ---------------------------------------------------------------- the simulated fleet


@dataclass(frozen=True)
class BoardSpec:
    name: str
    device_class: str
    cpu_quota: float
    host: int  # last octet of its address


def write_fleet_yaml(
    workdir: Path,
    name: str,
    classes: dict[str, Path],
    boards: Sequence[BoardSpec],
    models: list[dict],
    tuning: dict,
    command_timeout_s: int = 300,
) -> Path:
    """A fleet.yaml for the bench's own simulated fleet in `workdir`."""
    fleet = {
        "version": 1,
        "name": name,
        "workdir": "work",
        "sim": {"bridge": BRIDGE, "host_address": f"{SUBNET}.1/24"},
        "trackers": [
            {
                "name": "host",
                "bind_host": f"{SUBNET}.1",
                "public_address": f"{SUBNET}.1",
                "port": TRACKER_PORT,
                "port_end": TRACKER_PORT + 9,
            }
        ],
        "ssh": {
            "user": "root",
            "key": "work/sim/id_ed25519",
            "known_hosts": "work/known_hosts",
            "connect_timeout_s": 5,
            "command_timeout_s": command_timeout_s,
        },
        "device_classes": [{"name": c, "profile": str(p)} for c, p in classes.items()],
        "boards": [
            {
                "name": b.name,
                "address": f"{SUBNET}.{b.host}",
                "device_class": b.device_class,
                "python": os.path.abspath(sys.executable),
                "workdir": f"work/boards/{b.name}",
                "simulated": {"cpu_quota": b.cpu_quota},
            }
            for b in boards
        ],
        "models": models,
        "tuning": tuning,
        "artifacts": {
            "dir": "artifacts",
            "signing_key": "work/keys/signing.key",
            "public_key": "work/keys/signing.pub",
        },
    }
    path = workdir / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    return path


@contextlib.contextmanager
def running_fleet(fleet) -> Iterator[None]:
    """sim up + fleet up through the library; fleet down + sim down whatever happens."""
    from edgetune.fleet import fleet_down, fleet_up, sim_down, sim_up

    try:
        say(f"sim up + fleet up: {len(fleet.boards)} simulated boards on {BRIDGE}")
        simulated = sim_up(fleet)
        if not simulated.ok:
            raise SystemExit(f"sim up failed: {simulated.failed}")
        online = fleet_up(fleet)
        if not online.ok:
            raise SystemExit(f"fleet up failed: {online.failed}")
        say(
            "fleet online: "
            + ", ".join(f"{b.name} ({b.device_class}, quota {b.simulated.cpu_quota:g})" for b in fleet.boards)
        )
        yield
    finally:
        say("fleet down + sim down")
        try:
            fleet_down(fleet)
        finally:
            down = sim_down(fleet)
            if not down.ok:
                # sim_down can race the kernel's asynchronous removal of a veth after
                # `ip netns del` (ENODEV reading its ifalias) and then skips the board's cgroup;
                # it is idempotent, so a second pass removes what is left.
                say(f"sim down failed for {sorted(down.failed)} ({'; '.join(down.failed.values())}); retrying once")
                time.sleep(1.0)
                down = sim_down(fleet)
                if not down.ok:
                    say(f"WARNING: sim down left something: {down.failed}")


# ---------------------------------------------------------------- models


def make_cnn_onnx(path: Path, seed: int = 7) -> Path:
    """conv3x3 16->32 @32x32 + relu, depthwise 3x3 + relu, pointwise 32->64 + relu, global
    average pool, matmul 64->10 + bias; fixed-seed weights; opset 17."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def weight(name: str, shape: tuple[int, ...], fan_in: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(np.float32), name)

    def bias(name: str, size: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(size) * 0.05).astype(np.float32), name)

    inits = [
        weight("w1", (32, 16, 3, 3), 16 * 9),
        bias("b1", 32),
        weight("w2", (32, 1, 3, 3), 9),
        bias("b2", 32),
        weight("w3", (64, 32, 1, 1), 32),
        bias("b3", 64),
        weight("w4", (64, 10), 64),
        bias("b4", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=32),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "w4"], ["m"]),
        helper.make_node("Add", ["m", "b4"], ["y"]),
    ]
    name, shape = ONNX_CNN_INPUT
    graph = helper.make_graph(
        nodes,
        "bench-cnn",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    return save_onnx(graph, path)


def make_mobilenet_mini_onnx(path: Path, model) -> Path:
    """The built-in `mobilenet-mini` written as ONNX with the very weights edgetune binds
    (`builtin_weights`), for onnxruntime. The caller checks its outputs against edgetune's
    reference for the built-in before trusting any timing."""
    from onnx import TensorProto, helper, numpy_helper

    from edgetune.compiler.models import builtin

    inp = model.inputs[0]
    weights = builtin.builtin_weights(model)

    inits = [numpy_helper.from_array(array, name) for name, array in weights.items()]
    nodes: list = []

    def conv(x: str, prefix: str, out: str, stride: int, pad: int, group: int = 1) -> str:
        k = weights[f"{prefix}.weight"].shape[-1]
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{prefix}.weight", f"{prefix}.bias"],
                [out],
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[pad] * 4,
                group=group,
            )
        )
        return out

    def relu6(x: str, out: str) -> str:
        nodes.append(helper.make_node("Clip", [x, "zero", "six"], [out]))
        return out

    inits += [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
    ]
    x = relu6(conv(inp.name, "stem", "stem_c", 2, 1), "stem_r")
    for i, stride in ((1, 1), (2, 2), (3, 1)):
        channels = weights[f"block{i}.depthwise.weight"].shape[0]
        x = relu6(conv(x, f"block{i}.depthwise", f"b{i}_dc", stride, 1, group=channels), f"b{i}_dr")
        x = relu6(conv(x, f"block{i}.pointwise", f"b{i}_pc", 1, 0), f"b{i}_pr")
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], axis=1))
    nodes.append(helper.make_node("Gemm", ["flat", "classifier.weight", "classifier.bias"], ["logits"], transB=1))
    classes = weights["classifier.weight"].shape[0]
    graph = helper.make_graph(
        nodes,
        "mobilenet-mini-mirror",
        [helper.make_tensor_value_info(inp.name, TensorProto.FLOAT, list(inp.shape))],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [inp.shape[0], classes])],
        initializer=inits,
    )
    return save_onnx(graph, path)


def run_onnx_on_host(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


# ---------------------------------------------------------------- onnxruntime on a board

_ORT_SCRIPT = r"""
import json, math, sys, time
import numpy as np
import onnxruntime as ort

model, inputs_path, threads, repeats, min_repeat_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.inter_op_num_threads = 1
options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
with np.load(inputs_path) as data:
    feed = {name: data[name] for name in data.files}
outputs = session.run(None, feed)
start = time.perf_counter()
while time.perf_counter() - start < 0.2:  # warm-up, like TVM's first (discarded) call and more
    session.run(None, feed)
t0 = time.perf_counter(); session.run(None, feed); one = time.perf_counter() - t0
number = max(1, math.ceil(min_repeat_ms / 1e3 / max(one, 1e-9)))
samples = []
for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(number):
        session.run(None, feed)
    samples.append((time.perf_counter() - t0) / number)
print(json.dumps({"samples_s": samples, "number": number, "threads": threads, "ort": ort.__version__,
                  "outputs": [o.tolist() for o in outputs]}))
"""


@dataclass(frozen=True)
class OrtTiming:
    samples_s: list[float]
    number: int
    version: str
    outputs: list[np.ndarray]

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_s)) * 1e3


def stage_ort_files(board, model_path: Path, inputs: dict[str, np.ndarray], tag: str) -> tuple[str, str]:
    """Upload the ONNX model and the input (.npz) to the board's workdir over SFTP."""
    from edgetune.fleet.ssh import BoardSession

    local_npz = model_path.with_suffix(f".{tag}.input.npz")
    np.savez(local_npz, **inputs)
    remote_model = f"{board.workdir}/bench-{tag}.onnx"
    remote_npz = f"{board.workdir}/bench-{tag}.input.npz"
    with BoardSession(board) as ssh:
        ssh.run(f"mkdir -p {shlex.quote(board.workdir)}")
        sftp = ssh.connect().open_sftp()
        try:
            sftp.put(str(model_path), remote_model)
            sftp.put(str(local_npz), remote_npz)
        finally:
            sftp.close()
    return remote_model, remote_npz


def time_ort_on_board(
    board, remote_model: str, remote_npz: str, threads: int, repeats: int, min_repeat_ms: float
) -> OrtTiming:
    """onnxruntime on the board: a python process started over SSH, so inside the board's
    network namespace and CPU cgroup, as TVM's rpc_server is."""
    from edgetune.fleet.ssh import BoardSession

    command = (
        f"cd {shlex.quote(board.workdir)} && OMP_NUM_THREADS={threads} {shlex.quote(board.python)} -c "
        f"{shlex.quote(_ORT_SCRIPT)} {shlex.quote(remote_model)} {shlex.quote(remote_npz)} "
        f"{threads} {repeats} {min_repeat_ms:g}"
    )
    with BoardSession(board) as ssh:
        result = ssh.run(command)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return OrtTiming(data["samples_s"], data["number"], data["ort"], [np.array(o, np.float32) for o in data["outputs"]])


def save_onnx(graph, path: Path) -> Path:
    """An opset-17 model of `graph`, checked and saved at `path`."""
    import onnx
    from onnx import helper

    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="edgetune-bench")
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path
