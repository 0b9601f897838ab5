"""A class run's search split into shards (edgetune.tune.shard): how tasks and the budget are
dealt, and how the shards' accounts come back; the host's cores dealt to the classes that
search at once. The shards on a Ray cluster, their records and the
retrained cost model: tests/compute/test_ray_tuning.py (marker ray)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from edgetune.tune.budget import UNBOUNDED_TRIALS, TaskLedger
from edgetune.tune.monitor import RunState
from edgetune.tune.shard import SHARD_LOST, ShardOutcome, merge_states, placement, split_state
from edgetune.tune.tuner import SearchSettings


def run_state(weights: list[float], shares: list[int], budget: int, time_is_the_budget: bool = False) -> RunState:
    ledgers = [TaskLedger(f"h{i}", w, s, 10 * s, []) for i, (w, s) in enumerate(zip(weights, shares))]
    return RunState(
        "gw",
        {},
        ledgers,
        [f"task{i}" for i in range(len(ledgers))],
        budget,
        8,
        None,
        None,
        time_is_the_budget=time_is_the_budget,
    )


tasks = st.integers(1, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0.1, 100.0), min_size=n, max_size=n), st.lists(st.integers(0, 64), min_size=n, max_size=n)
    )
)


@given(tasks, st.integers(1, 8), st.integers(0, 5000))
def test_every_task_goes_to_one_shard_and_the_budget_is_dealt_whole(weights_shares, shards, budget):
    weights, shares = weights_shares
    state = run_state(weights, shares, budget)
    parts = split_state(state, shards)
    assert len(parts) == min(shards, len(weights))
    dealt = [ledger.workload_hash for part in parts for ledger in part.ledgers]
    assert sorted(dealt) == sorted(ledger.workload_hash for ledger in state.ledgers)
    assert all(part.ledgers for part in parts)
    assert sum(part.run_budget for part in parts) == budget and all(part.run_budget >= 0 for part in parts)
    for part in parts:  # a shard's names follow its ledgers
        assert [f"task{ledger.workload_hash[1:]}" for ledger in part.ledgers] == part.names
    loads = [sum(ledger.weight for ledger in part.ledgers) for part in parts]
    assert max(loads) - min(loads) <= max(weights) + 1e-9  # dealt heaviest first to the lightest shard


def test_a_time_budget_leaves_every_shard_unbounded():
    parts = split_state(run_state([1.0, 2.0, 3.0], [0, 0, 0], UNBOUNDED_TRIALS, time_is_the_budget=True), 2)
    assert [part.run_budget for part in parts] == [UNBOUNDED_TRIALS, UNBOUNDED_TRIALS]
    assert [part.device_class for part in parts] == ["gw shard 1/2", "gw shard 2/2"]


def test_the_shards_accounts_come_back_and_a_lost_shard_is_named():
    state = run_state([3.0, 2.0, 1.0], [8, 8, 8], 24)
    first, second = split_state(state, 2)
    measured = [
        TaskLedger(ledger.workload_hash, ledger.weight, ledger.share, ledger.ceiling, [1e-3] * 8, spent=8)
        for ledger in first.ledgers
    ]
    problems = merge_states(state, [ShardOutcome(tuple(measured), "time limit", "10.0.0.7 3f2a9c1e"), None])
    assert problems == ["time limit", SHARD_LOST]
    assert state.spent == 8 * len(first.ledgers)  # the lost shard's trials are counted from the database on resume
    assert placement(second, None).trials is None and placement(second, None).tasks == len(second.ledgers)


def test_the_search_threads_are_the_hosts_cores_shared_by_the_classes_at_once():
    alone = SearchSettings()
    assert alone.threads() == len(os.sched_getaffinity(0))  # a class tuned by itself
    assert alone.for_classes(2, 8).threads() == 4
    assert alone.for_classes(3, 2).threads() == 1  # never none
    assert SearchSettings(num_threads=3).for_classes(2, 8).threads() == 3  # an explicit count stays
