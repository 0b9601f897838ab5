"""Where a tuning run's wall time goes on this host alone, and with its candidate builds on a
local Ray cluster of 1, 2 and 3 worker nodes; candidate builds per second per worker; and from
the measured split, the trial rate expected of a cluster of N nodes of K cores with B boards.

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
run in rounds, in turn and in reversed order every other round (ABCDE EDCBA ...), and each number
is the median over the rounds with its spread (min-max).

The throughput model takes three costs per trial from the local runs: the search process's own
time (the profiler's total less its builds and its waits for the runner: evolutionary search,
cost model, bookkeeping; one core), the builds' core-seconds (the blocking build calls times the
build processes), and a board's seconds (configuration `local-exclusive`, where a round's
measurement is timed alone: its runner time times the boards). A class's search is one process
per shard, each round searched, then built, while the boards measure the previous one; so with S
shards on N nodes of K cores (a core per search, the rest building) and B boards:

    trials/s = min(S / (search + build / ((N*K - S) / S)), B / board)

It prints that rate for a few clusters and, per board count, the smallest cluster (fewest cores)
at which the boards, not the host, bound the run.

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
sys.path.insert(0, str(REPO / "tests"))  # loopback boards and small fleets of the tuning tests (tests/support)

from support.fleets import V3, make_fleet, mlp
from support.loopback_boards import Loopback, class_boards
from tvm.s_tir import meta_schedule as ms

from edgetune.inventory.schema import RayCompute
from edgetune.tune.on_ray import builder as ray_builder
from edgetune.tune.on_ray.cluster import connect_cluster
from edgetune.tune.on_ray.local_cluster import LocalCluster
from edgetune.tune.tuner import SearchSettings, TuneOptions, tune_class

CONFIGS = ("local", "local-exclusive", "ray-1", "ray-2", "ray-3")
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


def tune_once(
    compute: RayCompute | None, boards: Loopback, args, workdir: Path, exclusive: bool = False
) -> tuple[float, int, dict[str, float]]:
    fleet = make_fleet(
        workdir, boards.port, {"classa": V3}, {"classa": args.boards}, (mlp(),), args.trials, 8, args.trials
    )
    fleet = fleet.replace(compute=compute)
    ray_builder.builds_by_node.clear()
    started = time.monotonic()
    with ms.Profiler() as profiler:
        result = tune_class(fleet, "classa", TuneOptions(search=SearchSettings(), measure_exclusively=exclusive))
    wall = time.monotonic() - started
    assert result.ok, result.error
    if ray_builder.builds_by_node:
        print(f"  candidates built per Ray node: {dict(ray_builder.builds_by_node)}", flush=True)
    return wall, result.trials_run, {name: float(seconds) for name, seconds in profiler.get().items()}


@contextmanager
def compute_for(config: str) -> Iterator[RayCompute | None]:
    """None for the local ones; else a fresh local cluster of `config`'s worker nodes, this process its driver."""
    if config.startswith("local"):
        yield None
        return
    nodes = workers_of(config) // BUILD_WORKERS_PER_NODE
    with LocalCluster(head_cpus=0, worker_cpus=(NODE_CPUS,) * nodes) as cluster:
        compute = RayCompute(address=cluster.address, build_workers=workers_of(config))
        connect_cluster(compute)
        yield compute


def workers_of(config: str) -> int:
    """Build workers: LocalBuilder's two, or BUILD_WORKERS_PER_NODE per Ray node."""
    return 2 if config.startswith("local") else BUILD_WORKERS_PER_NODE * int(config.split("-")[1])


def main() -> None:
    args = parse_args()
    samples = {config: Samples() for config in CONFIGS}
    with (
        tempfile.TemporaryDirectory(prefix="edgetune-scale-out-") as scratch,
        class_boards(Path(scratch), "classa", args.boards) as boards,
    ):
        with compute_for("local") as compute:  # the first run in a process pays TVM's imports: not counted
            tune_once(compute, boards, args, Path(tempfile.mkdtemp(prefix="warm-up-", dir=scratch)))
        for round_index in range(args.rounds):
            order = CONFIGS if round_index % 2 == 0 else tuple(reversed(CONFIGS))
            for config in order:
                with compute_for(config) as compute:
                    workdir = Path(tempfile.mkdtemp(prefix=f"{config}-", dir=scratch))
                    wall, trials, split = tune_once(compute, boards, args, workdir, config == "local-exclusive")
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
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    print(
        f"\n{cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; mlp, {args.trials} trials, "
        f"{args.boards} loopback boards, {args.rounds} rounds; median (min-max) seconds"
    )
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
            print(
                f"  builds per second per build worker ({workers} workers): "
                f"{statistics.median(rates):.2f} ({min(rates):.2f}-{max(rates):.2f})"
            )
    report_model(TrialCosts.measured(samples["local"], samples["local-exclusive"], args.boards))


@dataclass(frozen=True)
class TrialCosts:
    """Seconds per trial: the search process's own (one core), the builds' core-seconds, a board's."""

    search_s: float
    build_core_s: float
    board_s: float

    @classmethod
    def measured(cls, local: Samples, exclusive: Samples, boards: int) -> TrialCosts:
        def per_trial(run: Samples, seconds_of) -> float:
            return statistics.median(seconds_of(run, i) / run.trials[i] for i in range(len(run.trials)))

        def entry(run: Samples, i: int, name: str) -> float:
            return run.split.get(name, [0.0] * len(run.trials))[i]

        def search(run: Samples, i: int) -> float:
            return entry(run, i, "Total") - sum(
                entry(run, i, n) for n in ("SendToBuilder", "SendToRunner", "JoinRunnerFutures")
            )

        return cls(
            search_s=per_trial(local, search),
            build_core_s=per_trial(local, lambda run, i: entry(run, i, "SendToBuilder") * workers_of("local")),
            board_s=per_trial(exclusive, lambda run, i: entry(run, i, "SendToRunner") * boards),
        )

    def rate(self, nodes: int, cores: int, boards: int, shards: int) -> float:
        """Trials per second of `shards` searches on `nodes` x `cores` with `boards` boards."""
        builders = (nodes * cores - shards) / shards
        if builders <= 0:
            return 0.0
        return min(shards / (self.search_s + self.build_core_s / builders), boards / self.board_s)

    def best(self, nodes: int, cores: int, boards: int) -> tuple[float, int]:
        """The highest rate over the shard counts that fit, and its shard count."""
        return max((self.rate(nodes, cores, boards, s), s) for s in range(1, nodes * cores))


def report_model(costs: TrialCosts) -> None:
    print(
        f"\nthroughput model: search {costs.search_s:.3f} s per trial (one core), builds "
        f"{costs.build_core_s:.3f} core-s per trial, a board {costs.board_s:.3f} s per trial"
    )
    print("\n| nodes x cores | boards | best shards | trials/min expected | bound by |\n|---|---|---|---|---|")
    for nodes, cores in ((1, 2), (1, 8), (2, 8), (4, 8), (8, 8)):
        for boards in (4, 16, 64):
            rate, shards = costs.best(nodes, cores, boards)
            bound = "boards" if rate >= boards / costs.board_s - 1e-9 else "host"
            print(f"| {nodes} x {cores} | {boards} | {shards} | {rate * 60:.0f} | {bound} |")
    for boards in (4, 16, 64):
        cores = next(c for c in range(2, 10_000) if costs.best(1, c, boards)[0] >= boards / costs.board_s - 1e-9)
        print(
            f"{boards} boards are the bound from {cores} cores on (any split into nodes; "
            f"{boards / costs.board_s * 60:.0f} trials/min)"
        )


if __name__ == "__main__":
    main()
