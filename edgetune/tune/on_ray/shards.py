"""A class run's search shards (edgetune.tune.shard) as Ray tasks of `cpus_per_class` CPUs on
any node, their measured records streamed back to the class run through a queue that lives on
the class run's own node (a lost shard's node takes none of its records with it).

The class run polls the queue while it waits, and commits what comes at once; a shard lost
with its node comes back as None, its trials already in the class database. A stop request
reaches the shards as it reaches the class run (they adopt its stop event); a second Ctrl-C
cancels the class run's task and, recursively, its shards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from edgetune.inventory.schema import Fleet
from edgetune.tune.on_ray import builder
from edgetune.tune.shard import ShardOutcome
from edgetune.tune.stop import adopt, stop_event

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the class run takes the shards' records from the queue


@ray.remote(max_retries=0)
def _shard(run: Callable[..., ShardOutcome], args: tuple, event, queue: Queue) -> ShardOutcome:
    adopt(event)
    builder.builds_by_node.clear()
    outcome = run(*args, queue.put)
    return replace(outcome, node=builder.node_label())


def run_shards(
    fleet: Fleet,
    device_class: str,
    shards: Sequence[tuple],
    run: Callable[..., ShardOutcome],
    commit: Callable[[list], None],
) -> list[ShardOutcome | None]:
    """`run(*args, send)` for each shard's `args` at once, each a Ray task; every list of records
    a shard passes to `send` is handed to `commit` here, in the order it came. Returns each
    shard's outcome, None for a shard that did not come back."""
    queue = Queue(
        actor_options={
            "num_cpus": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        }
    )
    try:
        refs = [
            _shard.options(num_cpus=fleet.compute.cpus_per_class).remote(run, args, stop_event(), queue)
            for args in shards
        ]
        pending = refs
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            _drain(queue, commit)
        _drain(queue, commit)
        return [_outcome(device_class, n, len(refs), ref) for n, ref in enumerate(refs)]
    finally:
        queue.shutdown(force=True)


def _drain(queue: Queue, commit: Callable[[list], None]) -> None:
    waiting = queue.size()
    if waiting:
        for records in queue.get_nowait_batch(waiting):
            commit(records)


def _outcome(device_class: str, index: int, shards: int, ref: Any) -> ShardOutcome | None:
    try:
        outcome = ray.get(ref)
    except ray.exceptions.RayError as err:
        log.error("[%s] shard %d/%d of the search failed on the Ray cluster: %s", device_class, index + 1, shards, err)
        return None
    log.info(
        "[%s] shard %d/%d searched %d tasks on Ray node %s: %d trials",
        device_class,
        index + 1,
        shards,
        len(outcome.ledgers),
        outcome.node,
        sum(ledger.spent for ledger in outcome.ledgers),
    )
    return outcome
