"""The Ray cluster of `compute: {ray: ...}`: connect to it, check its nodes, and run each device
class's tuning run on it as a Ray task.

Before anything starts, `connect_cluster` refuses a cluster that does not answer. Before
tuning, `check_nodes` runs a tiny task on every node: it opens a TCP connection to the tracker
of each class to tune (the class runs measure through it) and reads a token the host wrote into
the fleet's workdir (the class runs read the models and write the class databases there, so
every node must see the workdir at the same path: a shared file system). A node that fails
either is refused with what to fix, before a class starts.

`run_classes` submits one task per class, asking for `cpus_per_class` CPUs, so classes run on
different nodes at once; the task runs the class run it is given (the tuner's, with
`RayBuilder` fanning its builds out). Ray does not retry a class run (a second run of the class
would find its database held): a lost node ends its class with an error, every trial measured
so far kept, and a re-run resumes from the database. A stop request (Ctrl-C) reaches the class
runs through a flag they read before every round, so they end after the rounds in flight as a
local run does; a second Ctrl-C cancels them and their builds at once (`ray.cancel`).
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from edgetune.errors import TuneError
from edgetune.fleet.tracker import rpc_endpoint
from edgetune.inventory.schema import Fleet, RayCompute
from edgetune.tune.on_ray import builder
from edgetune.tune.stop import adopt, stop_requested

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 10.0
STOP_POLL_S = 0.25  # how soon a stop request is passed on to the class runs
WORKDIR_TOKEN = ".ray-node-check"

_connected_to: str | None = None  # the address this process is connected to


def connect_cluster(settings: RayCompute) -> None:
    """Connect this process to the cluster (once per address; a task on the cluster already is);
    a TuneError saying what to do if its head does not answer within `connect_timeout_s`."""
    global _connected_to
    if ray.is_initialized() and _connected_to in (None, settings.address):
        return
    host, port = settings.address.removeprefix("ray://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=settings.connect_timeout_s).close()
    except OSError as err:
        raise TuneError(
            f"the Ray cluster at {settings.address} (compute.ray.address) does not answer ({err}); nothing was "
            f"started. Start it (`ray start --head --port {port}` on the head, `ray start --address "
            f"{host}:{port}` on every other node), or set `compute: local` in fleet.yaml to tune on this host"
        ) from None
    if ray.is_initialized():  # connected to another cluster
        ray.shutdown()
    try:
        ray.init(address=settings.address, logging_level=logging.WARNING, log_to_driver=True)
    except Exception as err:  # noqa: BLE001 -- Ray raises ConnectionError, RuntimeError, ValueError ...
        raise TuneError(
            f"cannot join the Ray cluster at {settings.address} (compute.ray.address): {err}; "
            f"this host must be a node of the cluster (or use a ray://HOST:PORT client address)"
        ) from None
    _connected_to = settings.address


@dataclass(frozen=True)
class NodeCheck:
    node: str  # builder.node_label()
    problem: str | None


@ray.remote(num_cpus=0, max_retries=0)
def _check_node(trackers: list[tuple[str, int]], token_path: str, token: str) -> NodeCheck:
    for host, port in trackers:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        except OSError as err:
            return NodeCheck(
                builder.node_label(),
                f"cannot reach the tracker {host}:{port} ({err}); the class runs measure through it",
            )
    try:
        seen = Path(token_path).read_text()
    except OSError:
        seen = None
    if seen != token:
        return NodeCheck(
            builder.node_label(),
            f"does not see this host's workdir at {token_path.rsplit('/', 1)[0]}; "
            f"class runs read the models and write the class databases there: "
            f"mount it at the same path on every node",
        )
    return NodeCheck(builder.node_label(), None)


def join(fleet: Fleet, classes: list[str]) -> None:
    """Connect to the cluster of `fleet.compute` and check its nodes for tuning `classes`."""
    connect_cluster(fleet.compute)
    nodes = check_nodes(fleet, classes)
    log.info(
        "Ray cluster %s: %d nodes (%s), each reaches the tracker and sees the workdir",
        fleet.compute.address,
        len(nodes),
        ", ".join(nodes),
    )


def check_nodes(fleet: Fleet, classes: list[str]) -> list[str]:
    """Every alive node reaches the trackers of `classes` and sees the workdir, and the largest
    has the CPUs a class run and a build ask for; a TuneError naming the node and the fix
    otherwise. Returns the nodes' labels."""
    settings = fleet.compute
    nodes = [n for n in ray.nodes() if n["Alive"]]
    largest = max(n["Resources"].get("CPU", 0.0) for n in nodes)
    for field, cpus in (("cpus_per_class", settings.cpus_per_class), ("cpus_per_build", settings.cpus_per_build)):
        if cpus > largest:
            raise TuneError(
                f"compute.ray.{field} is {cpus:g} CPUs, but the largest node of the Ray cluster at "
                f"{settings.address} has {largest:g}: lower it, or add a larger node"
            )
    trackers = sorted({(e.host, e.port) for e in (rpc_endpoint(fleet, c) for c in classes)})
    token = secrets.token_hex(16)
    token_path = fleet.workdir / WORKDIR_TOKEN
    token_path.parent.mkdir(parents=True, exist_ok=True)
    token_path.write_text(token)
    on = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
    refs = {
        n["NodeID"]: _check_node.options(scheduling_strategy=on(n["NodeID"], soft=False)).remote(
            trackers, str(token_path), token
        )
        for n in nodes
    }
    checks = [check for check in (_checked(node, ref) for node, ref in refs.items()) if check is not None]
    for check in checks:
        if check.problem:
            raise TuneError(f"Ray node {check.node} {check.problem} (docs/compute.md); nothing was tuned")
    return [check.node for check in checks]


def _checked(node_id: str, ref) -> NodeCheck | None:
    """A node's check; None for a node that left the cluster after it was listed alive (Ray
    still lists a node it lost for a while): nothing is scheduled on it."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskUnschedulableError:
        log.warning("Ray node %s left the cluster while it was checked; nothing runs on it", node_id[:8])
        return None


@ray.remote(num_cpus=0)
class _StopFlag:
    """Set by the host on a stop request; read by the class runs before every round."""

    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def is_set(self) -> bool:
        return self.requested


@dataclass(frozen=True)
class _RemoteStopEvent:
    """What `stop.adopt` takes (anything with `is_set`), read from the host's `_StopFlag`."""

    flag: ray.actor.ActorHandle

    def is_set(self) -> bool:
        try:
            return ray.get(self.flag.is_set.remote(), timeout=PROBE_TIMEOUT_S)
        except ray.exceptions.RayError:  # the flag's node is gone: no request can come through it
            return False


@dataclass(frozen=True)
class Placement:
    """Where a class run searched, and how many of its candidates each node built."""

    search_node: str
    builds: dict[str, int]


@ray.remote(max_retries=0)
def _class_run(run: Callable[..., Any], args: tuple, flag) -> tuple[Any, Placement]:
    adopt(_RemoteStopEvent(flag))
    builder.builds_by_node.clear()
    result = run(*args)
    return result, Placement(builder.node_label(), dict(builder.builds_by_node))


def run_classes(fleet: Fleet, runs: Mapping[str, tuple], run: Callable[..., Any]) -> dict[str, Any]:
    """`run(*args)` for each class's `args` at once, each a Ray task of `cpus_per_class` CPUs:
    class name -> what it returned, or a TuneError saying why it ended (its node lost, say); the
    others go on."""
    flag = _StopFlag.remote()
    tasks = {
        name: _class_run.options(num_cpus=fleet.compute.cpus_per_class).remote(run, args, flag)
        for name, args in runs.items()
    }
    _wait(list(tasks.values()), flag)
    return {name: _outcome(name, ref) for name, ref in tasks.items()}


def _wait(refs: list, flag) -> None:
    """Wait for the class runs, passing a stop request on to them; on a second Ctrl-C
    (KeyboardInterrupt) cancel them, their builds with them."""
    pending, passed_on = refs, False
    try:
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=STOP_POLL_S)
            if not passed_on and stop_requested():
                flag.request.remote()
                passed_on = True
    except KeyboardInterrupt:
        for ref in refs:
            ray.cancel(ref, force=True, recursive=True)
        raise


def _outcome(name: str, ref) -> Any:
    try:
        result, placement = ray.get(ref)
    except ray.exceptions.RayError as err:
        log.error("[%s] its class run failed on the Ray cluster: %s", name, err)
        return TuneError(
            f"its run on the Ray cluster ended ({type(err).__name__}: its node lost, or the run "
            f"cancelled); every trial measured so far is kept: re-run to resume"
        )
    builds = ", ".join(f"{node}: {count}" for node, count in sorted(placement.builds.items())) or "none"
    log.info("[%s] searched on Ray node %s; candidates built per node: %s", name, placement.search_node, builds)
    return result
