"""Canonical JSON for the artifact formats, and a strict dataclass <-> JSON codec.

Canonical bytes: `json.dumps` with sorted keys, `(",", ":")` separators, no ASCII escaping,
no NaN/Infinity, encoded as UTF-8, no trailing newline. The same value always gives the same
bytes, so a sha256 of them is a content hash and an ed25519 signature over them is stable.

`load_json` decodes untrusted bytes strictly: UTF-8 only, no NaN/Infinity or numbers that
overflow to them, no duplicate keys, no lone surrogates, at most `MAX_JSON_DEPTH` levels deep.
`from_json` rebuilds a (frozen) dataclass from decoded JSON, checking every field's type:
unknown keys, missing keys and wrong types are `ArtifactError`s that name the JSON path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections import Counter
from typing import Any, Mapping, TypeVar

from edgetune.errors import ArtifactError

T = TypeVar("T")

MAX_JSON_DEPTH = 64  # the artifact formats nest about 6 levels; a profile's target a few more


def canonical_bytes(value: Any) -> bytes:
    """The canonical UTF-8 JSON encoding of `value` (dataclasses, tuples and dicts allowed)."""
    return json.dumps(
        to_json(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_json(data: bytes, where: str) -> Any:
    """Decode untrusted JSON bytes; any problem is an ArtifactError naming `where`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ArtifactError(f"{where}: not UTF-8 text (invalid byte at offset {err.start})") from None
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys
        )
    except RecursionError:
        raise ArtifactError(f"{where}: nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None
    except ValueError as err:  # JSONDecodeError, and integers beyond Python's digit limit
        raise ArtifactError(f"{where}: not valid JSON ({err})") from None
    except ArtifactError as err:  # raised by the hooks below, which do not know `where`
        raise ArtifactError(f"{where}: {err}") from None
    _check_plain(value, where)
    return value


def _refuse_constant(name: str) -> Any:
    raise ArtifactError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ArtifactError(f"{text[:40]} is too large to be a number here")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        duplicated = sorted(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        raise ArtifactError(f"duplicate key(s) {', '.join(map(repr, duplicated))[:200]}")
    return result


def _check_plain(value: Any, where: str) -> None:
    """Depth and strings of decoded JSON, without recursion (the value may be hostile)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ArtifactError(f"{where}: nested too deeply (more than {MAX_JSON_DEPTH} levels)")
        if isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str) and not item.isascii():
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ArtifactError(f"{where}: a string holds a lone surrogate escape (\\ud800-\\udfff)") from None


def to_json(value: Any) -> Any:
    """Plain JSON data (dict, list, str, int, float, bool, None) for `value`."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def load_versioned(cls: type[T], data: bytes, where: str, schema: str, version: int, what: str = "file") -> T:
    """`data` parsed as `cls`, a record of `schema` at `version`; every error names `where`."""
    raw = load_json(data, where)
    if not isinstance(raw, dict) or raw.get("schema") != schema:
        raise ArtifactError(f"{where}: not an {schema} {what}")
    if raw.get("schema_version") != version:
        raise ArtifactError(
            f"{where}: schema_version {str(raw.get('schema_version'))[:40]} is not supported "
            f"(this edgetune reads version {version})"
        )
    try:
        return from_json(cls, raw)
    except ArtifactError as err:
        raise ArtifactError(f"{where}: {err}") from None


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild `cls` (a dataclass) from `data`, strictly; errors name the JSON path ($.a.b[2])."""
    return _convert(cls, data, "$")


def _convert(tp: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, data, where)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(tp, data, where)
    if origin is tuple:
        item_type = typing.get_args(tp)[0]
        _expect(isinstance(data, list), where, "a list", data)
        return tuple(_convert(item_type, v, f"{where}[{i}]") for i, v in enumerate(data))
    if origin is dict or tp is dict:
        _expect(isinstance(data, dict), where, "an object", data)
        return dict(data)
    if tp is Any:
        return data
    if tp is float:
        _expect(isinstance(data, (int, float)) and not isinstance(data, bool), where, "a number", data)
        return float(data)
    if tp is int:
        _expect(isinstance(data, int) and not isinstance(data, bool), where, "an integer", data)
        return data
    _expect(isinstance(data, tp), where, f"a {tp.__name__}", data)
    return data


def _convert_dataclass(cls: type, data: Any, where: str) -> Any:
    _expect(isinstance(data, dict), where, "an object", data)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ArtifactError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = [n for n in names if n not in data]
    if missing:
        raise ArtifactError(f"{where}: missing key(s) {', '.join(missing)}")
    return cls(**{n: _convert(hints[n], data[n], f"{where}.{n}") for n in names})


def _convert_union(tp: Any, data: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if data is None:
        _expect(type(None) in args, where, "a value", data)
        return None
    (inner,) = [a for a in args if a is not type(None)]
    return _convert(inner, data, where)


def _expect(ok: bool, where: str, what: str, data: Any) -> None:
    if not ok:
        raise ArtifactError(f"{where}: expected {what}, got {type(data).__name__}")
