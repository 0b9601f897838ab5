"""Run one step on many boards at once and keep every board's outcome as data.

A failure on one board never stops the others: `GroupResult` holds what each board returned
(`succeeded`) and why each failing board failed (`failed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from edgetune.errors import EdgetuneError
from edgetune.inventory.schema import Board

T = TypeVar("T")
MAX_WORKERS = 16

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupResult(Generic[T]):
    succeeded: Mapping[str, T] = field(default_factory=dict)  # board name -> its result
    failed: Mapping[str, str] = field(default_factory=dict)  # board name -> reason, starting "<board>: "

    @property
    def ok(self) -> bool:
        return not self.failed


def for_each_board(boards: Iterable[Board], step: Callable[[Board], T], workers: int = MAX_WORKERS) -> GroupResult[T]:
    """`step(board)` on every board in a thread pool; an error becomes that board's reason."""
    boards = tuple(boards)
    if not boards:
        return GroupResult()
    with ThreadPoolExecutor(max_workers=min(workers, len(boards))) as pool:
        futures = {board.name: pool.submit(step, board) for board in boards}
    succeeded, failed = {}, {}
    for name, future in futures.items():
        try:
            succeeded[name] = future.result()
        except EdgetuneError as err:
            failed[name] = _naming(name, str(err))
        except Exception as err:  # a bug on one board must not hide the others' results
            log.debug("%s: unexpected error", name, exc_info=err)
            failed[name] = f"{name}: unexpected {type(err).__name__}: {err}"
    return GroupResult(succeeded, failed)


def _naming(name: str, reason: str) -> str:
    """Every reason starts with its board's name."""
    return reason if reason.startswith(f"{name}:") else f"{name}: {reason}"
