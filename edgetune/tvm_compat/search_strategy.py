"""Wrapping a MetaSchedule search strategy in a `PySearchStrategy` of one's own.

TVM 0.27 names the initialization step of a search strategy `_initialize_with_tune_context`,
with a leading underscore, on both `SearchStrategy` and `PySearchStrategy`: it is the name
`PySearchStrategy` subclasses must define (its `_tvm_metadata` lists it among the methods it
forwards), and the only way to initialize a strategy one wraps. There is no public name for it.
`initialize_with_tune_context` is the one place edgetune calls it.

edgetune.tune.search's `UnmeasuredSearch` wraps TVM's EvolutionarySearch to drop candidates the
database has measured: EvolutionarySearch remembers only what it picked in the current run
(its `measured_workloads_` starts empty, "TODO: add records from the database to avoid
re-measuring" in src/s_tir/meta_schedule/search_strategy/evolutionary_search.cc). No upstream
issue found. Tests: tests/tvm_compat/test_search_strategy.py.
"""

from __future__ import annotations

from tvm.s_tir import meta_schedule as ms


def initialize_with_tune_context(strategy: ms.search_strategy.SearchStrategy, context: ms.TuneContext) -> None:
    """Initialize `strategy` with `context`, as the task scheduler does before tuning."""
    strategy._initialize_with_tune_context(context)
