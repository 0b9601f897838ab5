"""Ending TVM RPC sessions on time, and uploading candidates that share a file name.

TVM 0.27:
- An `RPCSession` has no `close()` (apache/tvm#13500 proposed one and was closed unmerged):
  its connection ends, and its board goes back to the tracker, only when the object is freed.
  A finished measurement's session can be left in a reference cycle (one that raised: the
  traceback holds the evaluator's and the cleanup's frames; one whose worker the tracker had
  first handed a board that had just died), and an idle RPCRunner worker allocates nothing, so
  never collects: the board stays held until its session timeout.
  RPCRunner has no hook that runs in the worker after its measurement function returns (its
  `f_*` hooks all run inside it, while its frames still hold the session; `initializer` runs
  once), so `collect_after_each_measurement` wraps the runner's `pool` attribute:
  `CollectingPool` runs each measurement as `measure_then_collect`, which collects garbage once
  the measurement's frames are gone. `freeze_imports` (the pool's `initializer`) keeps the
  collection cheap.
- `session.load_module(name)` of a file name the session has loaded before returns the library
  already loaded under it (the dynamic loader looks libraries up by path), not the file just
  uploaded under that name. `own_upload_name` gives each upload a name of its own.
No upstream issue found for the second. Tests: tests/tvm_compat/test_rpc_session.py.
"""

from __future__ import annotations

import gc
import traceback
from pathlib import Path

from tvm.s_tir import meta_schedule as ms
from tvm.support.popen_pool import PopenPoolExecutor


def freeze_imports() -> None:
    """A measurement worker's initializer: what it has imported so far is never garbage, so
    `measure_then_collect`'s collection skips it (tens of milliseconds a collection unfrozen)."""
    gc.freeze()


def measure_then_collect(measure, *args):
    """One measurement in a runner worker (MetaSchedule's worker function), then a garbage
    collection there. A failure goes back as its text, so that nothing of it (its traceback
    holds the session) outlives the collection."""
    failure = None
    try:
        return measure(*args)
    except Exception:  # noqa: BLE001 (every failure becomes the trial's error, as in MetaSchedule)
        failure = traceback.format_exc()
    finally:
        gc.collect()
    raise RuntimeError(failure)


class CollectingPool:
    """An RPCRunner's worker pool whose every measurement is `measure_then_collect`."""

    def __init__(self, pool: PopenPoolExecutor) -> None:
        self.pool = pool

    def submit(self, measure, *args):
        return self.pool.submit(measure_then_collect, measure, *args)


def collect_after_each_measurement(runner: ms.runner.RPCRunner) -> ms.runner.RPCRunner:
    """`runner`, its workers collecting garbage after each measurement (`CollectingPool`).
    Build it with `initializer=freeze_imports`."""
    runner.pool = CollectingPool(runner.pool)
    return runner


def own_upload_name(serial: int, local_path: str) -> str:
    """The remote file name of a session's `serial`-th upload of `local_path`: never one the
    session has loaded before."""
    return f"{serial}-{Path(local_path).parent.name}-{Path(local_path).name}"
