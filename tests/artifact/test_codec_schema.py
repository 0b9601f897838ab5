"""The schema decoder (`codec.decode`) every edgetune file is read with: each rule refuses what
it should with the path and what is allowed, defaults fill absent or null keys, and nothing
outside the schema gets through."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgetune.artifact_format.codec import FrozenMap, SchemaError, decode, rule


@dataclass(frozen=True)
class Inner:
    window: int = rule(32, positive=True, maximum=100)
    gain: float = rule(0.02, between=(0.0, 0.99))


@dataclass(frozen=True)
class Outer:
    name: str = rule(check=lambda v: None if v.isidentifier() else f"'{v}' is not a valid name")
    mode: str = rule("fast", allowed=("fast", "slow"))
    count: int | None = rule(None, minimum=0, maximum=10)
    items: tuple[int, ...] = rule((), max_items=3)
    table: Mapping[str, int] = rule(factory=FrozenMap, expect="a mapping of name to count")
    inner: Inner = field(default_factory=Inner)
    either: int | str = 0
    where: Path | None = None


def test_defaults_fill_absent_and_null_keys():
    assert decode(Outer, {"name": "a", "mode": None, "inner": {"gain": 0.5}}) == Outer("a", inner=Inner(gain=0.5))
    decoded = decode(Outer, {"name": "a", "table": {"x": 1}, "items": [1, 2], "either": "text"})
    assert isinstance(decoded.table, FrozenMap) and decoded.items == (1, 2) and decoded.either == "text"


def test_paths_resolve_against_the_base(tmp_path):
    assert decode(Outer, {"name": "a", "where": "sub/../f"}, base=tmp_path).where == tmp_path / "f"
    with pytest.raises(SchemaError, match="where: is too long for a path"):
        decode(Outer, {"name": "a", "where": "x" * 300}, base=tmp_path)


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "root.name: required field is missing"),
        ({"name": "a", "nmae": 1}, "root.nmae: unknown key (did you mean 'name'?); allowed here: name, mode, count"),
        ({"name": "a b"}, "root.name: 'a b' is not a valid name"),
        ({"name": "a", "mode": "medium"}, "root.mode: 'medium' is not allowed (allowed: fast, slow)"),
        ({"name": "a", "count": -1}, "root.count: must be zero or more, got -1"),
        ({"name": "a", "count": 11}, "root.count: must be at most 10, got 11"),
        ({"name": "a", "count": True}, "root.count: must be an integer, got boolean True"),
        ({"name": "a", "items": [1, 2, 3, 4]}, "root.items: has 4 elements, more than the 3 allowed"),
        ({"name": "a", "items": [1, "2"]}, "root.items[1]: must be an integer, got str '2'"),
        ({"name": "a", "table": [1]}, "root.table: must be a mapping of name to count, got a list"),
        ({"name": "a", "table": {"odd key": "x"}}, "root.table[\"odd key\"]: must be an integer, got str 'x'"),
        ({"name": "a", "inner": {"window": 0}}, "root.inner.window: must be positive, got 0"),
        ({"name": "a", "inner": {"gain": 1.5}}, "root.inner.gain: must be between 0 and 0.99, got 1.5"),
        ({"name": "a", "inner": {"gain": float("inf")}}, "root.inner.gain: must be a finite number, got inf"),
        ({"name": "a", "inner": 3}, "root.inner: must be a mapping with keys window, gain, got int 3"),
        ({"name": "a", "either": 1.5}, "root.either: must be an integer, got float 1.5"),
        ([], "root: must be a mapping with keys name, mode"),
    ],
)
def test_each_rule_refuses_naming_the_path(data, message):
    with pytest.raises(SchemaError) as err:
        decode(Outer, data, "root", base=Path("/"))
    assert message in str(err.value)


def test_blank_text_is_refused_only_when_asked():
    assert decode(Outer, {"name": "a", "either": " "}).either == " "
    with pytest.raises(SchemaError, match="either: must not be empty"):
        decode(Outer, {"name": "a", "either": " "}, blank_text=False)
