"""A module's local Ray cluster, this process connected to it as a tuning run connects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from edgetune.inventory.schema import RayCompute
from edgetune.tune.on_ray.cluster import connect_cluster
from edgetune.tune.on_ray.local_cluster import LocalCluster


@contextmanager
def connected_cluster(head_cpus: float, worker_cpus: tuple[float, ...]) -> Iterator[LocalCluster]:
    cluster = LocalCluster(head_cpus, worker_cpus)
    try:
        connect_cluster(RayCompute(address=cluster.address))
        yield cluster
    finally:
        cluster.close()
