"""A Ray cluster on this machine, a head and worker nodes (`ray.cluster_utils.Cluster`), for
`make tune-fleet-ray` and the tests. It stops only the processes it started (never `ray stop`,
which kills every Ray process on the machine by name).

`python -m edgetune.tune.on_ray.local_cluster -f fleet.yaml` starts a head and two workers,
runs `edgetune tune-fleet -f fleet.yaml --ray <its address>`, and stops the cluster afterwards
whatever happens; Ctrl-C and SIGTERM are passed on to the job, which stops as it does locally.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from typing import Self

import ray
from ray.cluster_utils import Cluster

OBJECT_STORE_BYTES = 100 * 1024 * 1024  # the smallest Ray allows is 75 MB; this machine shares its memory
HEAD_CPUS = 1
WORKER_CPUS = (2, 2)


class LocalCluster:
    """A head of `head_cpus` CPUs and one worker node per entry of `worker_cpus`; `close` stops them."""

    def __init__(self, head_cpus: float = HEAD_CPUS, worker_cpus: tuple[float, ...] = WORKER_CPUS) -> None:
        started = time.monotonic()
        self.cluster = Cluster(initialize_head=True, head_node_args=self._node_args(head_cpus))
        try:
            self.workers = [self.add_node(cpus) for cpus in worker_cpus]
        except BaseException:
            self.cluster.shutdown()
            raise
        self.start_s = time.monotonic() - started

    @staticmethod
    def _node_args(cpus: float) -> dict:
        return {"num_cpus": cpus, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES}

    @property
    def address(self) -> str:
        return self.cluster.address

    def add_node(self, cpus: float):
        """Start one more worker node and wait until the cluster counts it."""
        node = self.cluster.add_node(**self._node_args(cpus))
        self.cluster.wait_for_nodes()
        return node

    def kill_node(self, node) -> None:
        """End a worker node at once, as a machine that is lost (its raylet and workers killed)."""
        self.cluster.remove_node(node, allow_graceful=False)

    def close(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


def run_job(fleet: str, extra: list[str]) -> int:
    """`edgetune tune-fleet` on a fresh local cluster; the cluster is stopped whatever happens."""
    print(
        f"starting a local Ray cluster: a head ({HEAD_CPUS} CPU) and {len(WORKER_CPUS)} worker nodes "
        f"({', '.join(map(str, WORKER_CPUS))} CPUs)",
        flush=True,
    )
    with LocalCluster() as cluster:
        print(f"Ray cluster up at {cluster.address} in {cluster.start_s:.0f} s", flush=True)
        job = subprocess.Popen(
            [sys.executable, "-m", "edgetune", "tune-fleet", "-f", fleet, "--ray", cluster.address, *extra]
        )
        previous = {
            s: signal.signal(s, lambda signum, _frame: job.send_signal(signum)) for s in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            return job.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if job.poll() is None:
                job.kill()
                job.wait()
            print("stopping the local Ray cluster", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--fleet", default="fleet.yaml")
    args, extra = parser.parse_known_args()
    return run_job(args.fleet, extra)


if __name__ == "__main__":
    sys.exit(main())
