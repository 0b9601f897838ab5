"""Where a tuning run's wall time goes on this host alone, and with its candidate builds on a
local Ray cluster of 1, 2 and 3 worker nodes; candidate builds per second per worker.

Each configuration tunes the same class from an empty database (mlp, `--trials` trials, on
`--boards` loopback boards: a TVM tracker and rpc_servers on 127.0.0.1, the tuning tests'
`Loopback`) with `tune_class` run in this process under MetaSchedule's `Profiler`, which splits
the wall time by what the tuning loop was doing (search, cost model, builds, waiting for the
boards ...). Locally the builds are two build processes; with Ray they are Ray tasks on the
worker nodes (`RayBuilder`, `build_workers` = 2 per node), while the search stays in one process
(here this one, so that the profiler sees it; on a cluster it is a class run's task).

All on one machine: the Ray nodes, the host and the boards share its cores, so this measures
the split and the overheads of going through Ray, not the speed-up of more machines.
After an uncounted warm-up run (the first in a process pays TVM's imports), configurations are
run in rounds, in turn and in reversed order every other round (ABCD DCBA ...), and each number
is the median over the rounds with its spread (min-max).

    .venv/bin/python bench/scale_out.py --rounds 2 --trials 48
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "tune"))  # Loopback boards and small fleets of the tuning tests

from fleets import V3, make_fleet, mlp
from loopback_boards import Loopback, class_boards
from tvm.s_tir import meta_schedule as ms

from edgetune.inventory.schema import RayCompute
from edgetune.tune.on_ray import builder as ray_builder
from edgetune.tune.on_ray.cluster import connect_cluster
from edgetune.tune.on_ray.local_cluster import LocalCluster
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

CONFIGS = ("local", "ray-1", "ray-2", "ray-3")
BUILD_WORKERS_PER_NODE = 2
NODE_CPUS = 2


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    trials: list[int] = field(default_factory=list)
    split: dict[str, list[float]] = field(default_factory=dict)  # profiler entry -> seconds per round


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=48, help="trials of the class per run (rounds of 8)")
    parser.add_argument("--boards", type=int, default=2)
    return parser.parse_args()


def tune_once(compute: RayCompute | None, boards: Loopback, args, workdir: Path) -> tuple[float, int, dict[str, float]]:
    fleet = make_fleet(workdir, boards.port, {"classa": V3}, {"classa": args.boards}, (mlp(),), args.trials, 8, args.trials)
    fleet = fleet.replace(compute=compute)
    ray_builder.builds_by_node.clear()
    started = time.monotonic()
    with ms.Profiler() as profiler:
        result = tune_class(fleet, "classa", TuneOptions(search=SearchSettings(), measure_exclusively=False))
    wall = time.monotonic() - started
    assert result.ok, result.error
    if ray_builder.builds_by_node:
        print(f"  candidates built per Ray node: {dict(ray_builder.builds_by_node)}", flush=True)
    return wall, result.trials_run, {name: float(seconds) for name, seconds in profiler.get().items()}


@contextmanager
def compute_for(config: str) -> Iterator[RayCompute | None]:
    """None for `local`; else a fresh local cluster of `config`'s worker nodes, this process its driver."""
    if config == "local":
        yield None
        return
    nodes = workers_of(config) // BUILD_WORKERS_PER_NODE
    with LocalCluster(head_cpus=0, worker_cpus=(NODE_CPUS,) * nodes) as cluster:
        compute = RayCompute(address=cluster.address, build_workers=workers_of(config))
        connect_cluster(compute)
        yield compute


def workers_of(config: str) -> int:
    """Build workers: LocalBuilder's two, or BUILD_WORKERS_PER_NODE per Ray node."""
    return 2 if config == "local" else BUILD_WORKERS_PER_NODE * int(config.split("-")[1])


def main() -> None:
    args = parse_args()
    samples = {config: Samples() for config in CONFIGS}
    with (tempfile.TemporaryDirectory(prefix="edgetune-scale-out-") as scratch,
          class_boards(Path(scratch), "classa", args.boards) as boards):
        with compute_for("local") as compute:  # the first run in a process pays TVM's imports: not counted
            tune_once(compute, boards, args, Path(tempfile.mkdtemp(prefix="warm-up-", dir=scratch)))
        for round_index in range(args.rounds):
            order = CONFIGS if round_index % 2 == 0 else tuple(reversed(CONFIGS))
            for config in order:
                with compute_for(config) as compute:
                    workdir = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=scratch))
                    wall, trials, split = tune_once(compute, boards, args, workdir)
                print(f"round {round_index + 1} {config}: {trials} trials in {wall:.1f} s", flush=True)
                record(samples[config], wall, trials, split)
    report(args, samples)


def record(into: Samples, wall: float, trials: int, split: dict[str, float]) -> None:
    into.wall_s.append(wall)
    into.trials.append(trials)
    for name, seconds in split.items():
        into.split.setdefault(name, []).append(seconds)


def median_spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def report(args, samples: dict[str, Samples]) -> None:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    print(f"\n{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; mlp, {args.trials} trials, "
          f"{args.boards} loopback boards, {args.rounds} rounds; median (min-max) seconds")
    for config, run in samples.items():
        print(f"\n{config}: wall {median_spread(run.wall_s)} s, trials {statistics.median(run.trials):.0f}")
        wall = statistics.median(run.wall_s)
        for name, seconds in sorted(run.split.items(), key=lambda item: -statistics.median(item[1])):
            share = statistics.median(seconds) / wall
            if share >= 0.01:
                print(f"  {name:<40} {median_spread(seconds):>22}  {share:6.1%}")
        build_s = [sum(s) for s in zip(*(v for k, v in run.split.items() if "Build" in k))] or None
        if build_s:
            workers = workers_of(config)
            rates = [trials / seconds / workers for trials, seconds in zip(run.trials, build_s) if seconds > 0]
            print(f"  builds per second per build worker ({workers} workers): "
                  f"{statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f})")


if __name__ == "__main__":
    main()
