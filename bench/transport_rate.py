"""Trials per minute of a class run through each transport, same fleet, same budget: the
tracker and RPC on the board's address (`direct`), through the board's own SSH connection
(`ssh`), and through that connection across one and two ProxyJump hops (`hop1`, `hop2`).

What it does, through edgetune's own library:
1. writes the bench's small ONNX CNN and brings up its own simulated fleet: the measured board
   `tr-m` (class bench-transport, cpu quota 1.0) and two boards that serve as its bastions
   (`tr-j1`, `tr-j2`, class bench-jump, quota 0.25, never tuned);
2. per turn, the transports in turn (direct ssh hop1 hop2, then reversed, ...): `fleet down`,
   `fleet up` with the transport's fleet.yaml (the same fleet, the board's `ssh.transport` and
   its ProxyJump changed), then one class run of `--trials-per-task` per task from an empty
   database;
3. prints per transport the median trials per minute with min-max, and each one's ratio to
   `direct` (medians), and the keepers' resident memory.

Run: .venv/bin/python bench/transport_rate.py [--turns 3] [--trials-per-task 16]
Needs root (network namespaces, cgroups); holds /tmp/edgetune-bench.lock while running.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

import yaml
from _benchlib import (
    ONNX_CNN_INPUT,
    REPO,
    SUBNET,
    BoardSpec,
    bench_main,
    load_now,
    machine_facts,
    make_cnn_onnx,
    running_fleet,
    say,
    write_fleet_yaml,
)

CLASS = "bench-transport"
JUMP_CLASS = "bench-jump"
PROFILE = REPO / "device_profiles" / "x86-64-v3.yaml"
MEASURED = BoardSpec("tr-m", CLASS, 1.0, 21)
JUMPS = (BoardSpec("tr-j1", JUMP_CLASS, 0.25, 22), BoardSpec("tr-j2", JUMP_CLASS, 0.25, 23))
TRANSPORTS = {"direct": ("direct", ()), "ssh": ("ssh", ()), "hop1": ("ssh", JUMPS[:1]), "hop2": ("ssh", JUMPS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3, help="class runs per transport (interleaved)")
    parser.add_argument("--trials-per-task", type=int, default=16)
    parser.add_argument("--trials-per-iter", type=int, default=16)
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args()
    bench_main("transport-rate", args, run)


def run(args: argparse.Namespace, workdir: Path) -> None:
    from edgetune.fleet import fleet_down, fleet_up
    from edgetune.inventory import load_fleet

    facts = machine_facts()
    make_cnn_onnx(workdir / "cnn.onnx")
    name, shape = ONNX_CNN_INPUT
    models = [{"name": "cnn", "onnx": "cnn.onnx", "inputs": [{"name": name, "shape": list(shape), "dtype": "float32"}]}]
    tuning = {"trials_per_task": args.trials_per_task, "trials_per_iter": args.trials_per_iter, "early_stop": None}
    base = write_fleet_yaml(
        workdir, "bench-transport", {CLASS: PROFILE, JUMP_CLASS: PROFILE}, [MEASURED, *JUMPS], models, tuning
    )
    fleets = {label: _variant(base, label, transport, jumps) for label, (transport, jumps) in TRANSPORTS.items()}
    order = [list(TRANSPORTS) if turn % 2 == 0 else list(reversed(TRANSPORTS)) for turn in range(args.turns)]
    rates: dict[str, list[float]] = {label: [] for label in TRANSPORTS}
    keeper_mb: list[float] = []
    with running_fleet(load_fleet(base)):
        for turn in order:
            for label in turn:
                fleet = load_fleet(fleets[label])
                fleet_down(fleet)
                online = fleet_up(fleet)
                if not online.ok:
                    raise SystemExit(f"fleet up ({label}) failed: {online.failed}")
                keeper_mb += _keeper_rss_mb(fleet)
                trials, seconds = _one_run(fleet)
                rates[label].append(trials / seconds * 60)
                say(f"{label}: {trials} trials in {seconds:.0f} s: {rates[label][-1]:.1f} trials/min")
        fleet_down(load_fleet(fleets[order[-1][-1]]))
    _report(args, facts, rates, keeper_mb)


def _variant(base: Path, label: str, transport: str, jumps) -> Path:
    """fleet.yaml beside `base` (the same workdir) whose measured board uses `transport`
    through `jumps`, named in an ssh config by their addresses."""
    data = yaml.safe_load(base.read_text())
    measured = next(b for b in data["boards"] if b["name"] == MEASURED.name)
    ssh = {"transport": transport}
    if jumps:
        config = base.with_name(f"ssh_config-{label}")
        hops = ",".join(f"{SUBNET}.{jump.host}" for jump in jumps)
        config.write_text(f"Host {SUBNET}.{MEASURED.host}\n    ProxyJump {hops}\n")
        ssh["config"] = str(config)
    measured["ssh"] = ssh
    path = base.with_name(f"fleet-{label}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _keeper_rss_mb(fleet) -> list[float]:
    from edgetune.fleet.state import load_fleet_state

    sizes = []
    for record in load_fleet_state(fleet).boards.values():
        if record.tunnel is not None:
            status = Path(f"/proc/{record.tunnel.pid}/status").read_text()
            sizes.append(int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024)
    return sizes


def _one_run(fleet) -> tuple[int, float]:
    """One class run from an empty database: (trials, seconds)."""
    from edgetune.tune.database import ClassDatabasePaths
    from edgetune.tune.stop import stop_requested, tuning
    from edgetune.tune.tuner import TuneOptions, tune_class

    shutil.rmtree(ClassDatabasePaths.of(fleet.workdir, CLASS).directory, ignore_errors=True)
    with tuning():
        result = tune_class(fleet, CLASS, TuneOptions(models=("cnn",)))
    if stop_requested():
        raise SystemExit("stopped during tuning")
    if not result.ok:
        raise SystemExit(f"tuning failed: {result.error}")
    return result.trials_run, result.tuning_time_s


def _report(args, facts: str, rates: dict[str, list[float]], keeper_mb: list[float]) -> None:
    print()
    print(f"machine: {facts}; {load_now()}")
    print(
        f"class {CLASS} ({PROFILE.name}), board {MEASURED.name} (quota 1.0), model cnn, "
        f"{args.trials_per_task} trials per task in rounds of {args.trials_per_iter}, no early stop"
    )
    direct = statistics.median(rates["direct"])
    print(f"{'transport':<10} {'trials/min median':>18} {'min-max':>14} {'runs':>5} {'vs direct':>10}")
    for label, values in rates.items():
        median = statistics.median(values)
        print(
            f"{label:<10} {median:>18.1f} {f'{min(values):.1f}-{max(values):.1f}':>14} {len(values):>5} {median / direct:>9.2f}x"
        )
    if keeper_mb:
        print(
            f"keeper resident memory: median {statistics.median(keeper_mb):.0f} MB ({min(keeper_mb):.0f}-{max(keeper_mb):.0f})"
        )


if __name__ == "__main__":
    main()
