"""Board selectors: `--select key=value[,key=value...]` picks the boards whose every pair
matches. A key is a label of fleet.yaml's `boards[].labels`, or one of the special names
`class` (the board's device class) and `board` (its name).

A class's tuning pool (fleet.yaml `device_classes[].tuning_pool`) names its boards, or selects
them the same way. Pure: parsing and matching only. A selector that cannot be parsed, names a
label no board has, or matches no board is an `InventoryError` (nothing is started).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from edgetune.errors import InventoryError
from edgetune.inventory.fields import RESERVED_LABELS, label_key_problem, label_value_problem, name_problem
from edgetune.inventory.schema import Board

OPTION = "--select"
MAX_PAIRS = 64
POOL_NAMES_SHOWN = 10  # board names an error about a tuning pool lists


@dataclass(frozen=True)
class Selector:
    """The pairs a board must all match, in the order given."""

    pairs: tuple[tuple[str, str], ...]

    @property
    def text(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.pairs)

    def matches(self, board: Board) -> bool:
        return all(board_value(board, key) == value for key, value in self.pairs)


def board_value(board: Board, key: str) -> str | None:
    """What `board` has for a selector's `key`: its class, its name, or its label (None: no such label)."""
    if key == "class":
        return board.device_class
    if key == "board":
        return board.name
    return board.labels.get(key)


def parse_selector(text: str, option: str = OPTION) -> Selector:
    """`key=value[,key=value...]` as a Selector; each key at most once."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(","):
        key, equals, value = (piece.strip() for piece in part.partition("="))
        if not equals or not key or not value:
            raise InventoryError(
                f"{option} {text!r}: '{part.strip()}' is not key=value; write e.g. "
                f"{option} site=berlin,class=gateway-v2 (every pair must match)"
            )
        if key in RESERVED_LABELS:
            problem = name_problem(value)
        else:
            problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise InventoryError(f"{option} {text!r}: {problem}")
        if any(key == seen for seen, _ in pairs):
            raise InventoryError(f"{option} {text!r}: '{key}' is given twice; a board has one value per key")
        pairs.append((key, value))
    if len(pairs) > MAX_PAIRS:
        raise InventoryError(f"{option} {text!r}: more than {MAX_PAIRS} pairs")
    return Selector(tuple(pairs))


def select_boards(boards: Iterable[Board], selector: Selector, option: str = OPTION) -> tuple[Board, ...]:
    """The boards `selector` matches, in their order. Refused: a key that is no label of any of
    `boards`, and a selector that matches none of them."""
    boards = tuple(boards)
    known = sorted({key for board in boards for key in board.labels})
    for key, _ in selector.pairs:
        if key not in RESERVED_LABELS and key not in known:
            labels = f"the labels boards have: {', '.join(known)}" if known else "no board has labels"
            raise InventoryError(
                f"{option} {selector.text}: no board has a label '{key}' ({labels}; "
                f"or {' and '.join(RESERVED_LABELS)}: a board's device class and name)"
            )
    selected = tuple(board for board in boards if selector.matches(board))
    if not selected:
        raise InventoryError(f"{option} {selector.text} matches no board; " + _closest(boards, selector))
    return selected


def _closest(boards: tuple[Board, ...], selector: Selector) -> str:
    """What the boards have for each key of the selector: where the selector went wrong."""
    said = []
    for key, _ in selector.pairs:
        values = sorted({value for board in boards if (value := board_value(board, key)) is not None})
        shown = ", ".join(values[:10]) + (f" ... ({len(values)} values)" if len(values) > 10 else "")
        said.append(f"{key}: {shown}")
    return "the boards have " + "; ".join(said)


def pool_members(item: str, own: tuple[Board, ...], boards: tuple[Board, ...]) -> set[str]:
    """The boards of a class (`own`, of the fleet's `boards`) that a tuning pool's `item` names
    (a board name) or matches (a selector): at least one."""
    if "=" not in item:
        return {_pool_board(item, own, boards)}
    selector = parse_selector(item, option="selector")
    matched = {b.name for b in own if selector.matches(b)}
    if not matched:
        have = "; ".join(
            f"{key}: {', '.join(sorted({v for b in own if (v := board_value(b, key)) is not None})) or 'none'}"
            for key, _ in selector.pairs
        )
        raise InventoryError(
            f"selector '{item}' matches no board of class '{own[0].device_class}' (its boards have {have}); "
            f"allowed: {_pool_allowed(own)}"
        )
    return matched


def _pool_board(name: str, own: tuple[Board, ...], boards: tuple[Board, ...]) -> str:
    if any(b.name == name for b in own):
        return name
    other = next((b for b in boards if b.name == name), None)
    if other is not None:
        raise InventoryError(
            f"'{name}' is a board of class '{other.device_class}', not of '{own[0].device_class}'; "
            f"allowed: {_pool_allowed(own)}"
        )
    hint = difflib.get_close_matches(name, [b.name for b in own], n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise InventoryError(f"'{name}' is not a board of the fleet{suggestion}; allowed: {_pool_allowed(own)}")


def _pool_allowed(own: tuple[Board, ...]) -> str:
    names = ", ".join(b.name for b in own[:POOL_NAMES_SHOWN]) + (" ..." if len(own) > POOL_NAMES_SHOWN else "")
    return f"the class's boards ({names}), or selectors key=value[,key=value...] over their labels"
