"""Canonical JSON for the artifact formats, and the one schema decoder of edgetune's files.

Canonical bytes: `json.dumps` with sorted keys, `(",", ":")` separators, no ASCII escaping,
no NaN/Infinity, encoded as UTF-8, no trailing newline. The same value always gives the same
bytes, so a sha256 of them is a content hash and an ed25519 signature over them is stable.

`load_json` decodes untrusted bytes strictly: UTF-8 only, no NaN/Infinity or numbers that
overflow to them, no duplicate keys, no lone surrogates, at most `MAX_JSON_DEPTH` levels deep.
`decode` is the one schema decoder of edgetune's files (the artifact formats here, the agent's
files, the fleet's state files, fleet.yaml and device profiles): a schema is a frozen dataclass
whose field types and `rule`s (allowed values, ranges, defaults, checks) say what each
value may be, and any misfit is a `SchemaError` naming its path (`boards[2].name`) and what is
allowed. A key that is absent or null takes the field's default; a field without a default
is required (a null is then accepted only where the type allows None). `from_json` is
`decode` for the artifact formats, its errors `ArtifactError`s. A `derived_field` is no key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
import re
import types
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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
    """Plain JSON data (dict, list, str, int, float, bool, None) for `value`; an `added_field`
    left at None is not written."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get(_ADDED) and getattr(value, f.name) is None)
        }
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


VERSION_KEYS = ("schema", "schema_version")


def load_versioned(
    cls: type[T],
    data: bytes,
    where: str,
    schema: str,
    version: int,
    what: str = "file",
    error: type[Exception] = ArtifactError,
    reader: str = "this edgetune",
    unversioned_is_current: bool = False,
) -> T:
    """`data` parsed as `cls`, a record of `schema` at `version` (`cls` holds the two version
    keys as fields, or is the rest of the record); every problem is an `error` naming `where`.
    `unversioned_is_current`: a record without the version keys (written before the file
    carried them, in the same shape) is read as the current version."""
    try:
        raw = load_json(data, where)
    except ArtifactError as err:
        raise error(str(err)) from None
    if unversioned_is_current and isinstance(raw, dict) and not set(VERSION_KEYS) & set(raw):
        raw = {"schema": schema, "schema_version": version, **raw}
    if not isinstance(raw, dict) or raw.get("schema") != schema:
        raise error(f"{where}: schema: not an {schema} {what}")
    if raw.get("schema_version") != version:
        raise error(
            f"{where}: schema_version: {str(raw.get('schema_version'))[:40]} is not supported "
            f"({reader} reads version {version})"
        )
    if "schema" not in {f.name for f in dataclasses.fields(cls)}:  # type: ignore[arg-type]  # cls: a dataclass
        raw = {k: v for k, v in raw.items() if k not in VERSION_KEYS}
    try:
        return decode(cls, raw)
    except SchemaError as err:
        raise error(f"{where}: {err}") from None


def from_json(cls: type[T], data: Any) -> T:
    """Rebuild `cls` (a dataclass) from decoded JSON, strictly; an ArtifactError names the path."""
    try:
        return decode(cls, data)
    except SchemaError as err:
        raise ArtifactError(str(err)) from None


# -- the schema decoder ---------------------------------------------------------------------------
class FrozenMap(dict):
    """A dict that cannot change once built. Unlike MappingProxyType it pickles, so records
    can cross to the worker processes that tune classes concurrently."""

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("records are immutable")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _immutable  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[Any, Any]]]:
        return (FrozenMap, (dict(self),))


class SchemaError(ValueError):
    """A value that does not fit its schema: where it is (`boards[2].name`) and what is allowed."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Rule:
    """What a field allows beyond its type (see `rule`)."""

    allowed: tuple[Any, ...] | None = None
    expect: str | None = None
    positive: bool = False
    minimum: float | None = None
    maximum: float | None = None
    between: tuple[float, float] | None = None
    max_items: int | None = None
    check: Callable[[Any], str | None] | None = None


_NO_RULE = Rule()


def rule(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, **limits: Any) -> Any:
    """A dataclass field with a `Rule`: `allowed` values, `expect` (what a value of the wrong
    type is told it must be), `positive`, `minimum`, `maximum`, `between` (inclusive),
    `max_items` of a list or mapping, and `check` (a function returning what is wrong with a value, or None). `factory` makes the
    default, as `dataclasses.field`'s default_factory."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"rule": Rule(**limits)})


_ADDED = "added"
_DERIVED = "derived"


def derived_field(default: Any) -> Any:
    """A field of a record that its file does not hold (e.g. the file's own path): decoding
    leaves it at `default`, and the file's reader sets it (`dataclasses.replace`)."""
    return dataclasses.field(default=default, metadata={_DERIVED: True})


def added_field() -> Any:
    """A field added to a record after files of it were written (and signed): None by default
    and then not written at all, so that such a file read back serializes to its very bytes."""
    return dataclasses.field(default=None, metadata={_ADDED: True})


def join_path(path: str, key: str | int) -> str:
    """The path of `key` inside the value at `path` (`boards[2]`, `ssh.key`, `hardware["l2 kb"]`)."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f"{path}[{json.dumps(key, ensure_ascii=False)[:80]}]"
    return f"{path}.{key}" if path else key


def describe(value: Any) -> str:
    """A value as an error message shows it: its kind, and the value itself when short."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    kind = "boolean" if isinstance(value, bool) else type(value).__name__
    text = repr(value)
    return f"{kind} {text if len(text) <= 80 else text[:77] + '...'}"


def decode(cls: type[T], data: Any, path: str = "", *, base: Path | None = None, blank_text: bool = True) -> T:
    """`data` (plain JSON or YAML data) as `cls` (a frozen dataclass, or a type such as int,
    Path, tuple[X, ...] or Mapping[str, X]), every value checked against its field's type and
    `Rule`; a `SchemaError` names the first misfit's path (below `path`). A record already built
    (a reader's derivation in place of what its file spells) is taken as it is.
    `base`: the folder relative `Path` fields are resolved against; `blank_text` False refuses
    empty or blank strings."""
    return _Decoder(base, blank_text).value(cls, data, path, _NO_RULE)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", Path: "a path"}
MAX_PATH_CHARS = 4000  # PATH_MAX is 4096 bytes


class _Decoder:
    def __init__(self, base: Path | None, blank_text: bool) -> None:
        self.base = base
        self.blank_text = blank_text

    def value(self, tp: Any, data: Any, path: str, limits: Rule) -> Any:
        origin = typing.get_origin(tp)
        if dataclasses.is_dataclass(tp):
            value = self.record(tp, data, path)  # type: ignore[arg-type]  # an annotation: a class, not an instance
        elif origin in (typing.Union, types.UnionType):
            return self.union(tp, data, path, limits)
        elif origin is tuple:
            value = self.sequence(typing.get_args(tp)[0], data, path, limits)
        elif origin in (dict, Mapping) or tp is dict:
            value = self.mapping(tp, data, path, limits)
        elif tp is Any:
            value = data
        else:
            value = self.scalar(tp, data, path)
        self.check(value, path, limits)
        return value

    def record(self, cls: type, data: Any, path: str) -> Any:
        if isinstance(data, cls):  # a record its reader derived from the file already
            return data
        fields = [f for f in dataclasses.fields(cls) if not f.metadata.get(_DERIVED)]
        keys = tuple(f.name for f in fields)
        if not isinstance(data, dict):
            raise SchemaError(path, f"must be a mapping with keys {', '.join(keys)}, got {describe(data)}")
        for key in data:
            if key not in keys:
                hint = difflib.get_close_matches(str(key), keys, n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                raise SchemaError(
                    join_path(path, str(key)), f"unknown key{suggestion}; allowed here: {', '.join(keys)}"
                )
        hints = _type_hints(cls)
        values = {}
        for field in fields:
            key, limits = field.name, field.metadata.get("rule", _NO_RULE)
            where = join_path(path, key)
            raw = data.get(key)
            if raw is not None or (key in data and field_default(field) is dataclasses.MISSING):
                values[field.name] = self.value(hints[field.name], raw, where, limits)
            elif field_default(field) is not dataclasses.MISSING:
                values[field.name] = field_default(field)
            else:
                raise SchemaError(where, "required field is missing")
        return cls(**values)

    def union(self, tp: Any, data: Any, path: str, limits: Rule) -> Any:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            if len(args) == len(typing.get_args(tp)):
                raise SchemaError(path, "required field is missing")
            return None
        if len(args) == 1:
            return self.value(args[0], data, path, limits)
        fitting = [arg for arg in args if _fits(arg, data)]
        return self.value((fitting or args)[0], data, path, limits)  # none fits: the first says what it needs

    def sequence(self, item_type: Any, data: Any, path: str, limits: Rule) -> tuple:
        if not isinstance(data, list):
            raise SchemaError(path, f"must be {limits.expect or 'a list'}, got {describe(data)}")
        self.count(data, path, limits)
        return tuple(self.value(item_type, v, join_path(path, i), _NO_RULE) for i, v in enumerate(data))

    def mapping(self, tp: Any, data: Any, path: str, limits: Rule) -> dict:
        if not isinstance(data, dict):
            raise SchemaError(path, f"must be {limits.expect or 'a mapping'}, got {describe(data)}")
        self.count(data, path, limits)
        args = typing.get_args(tp)
        value_type = args[1] if args else Any
        items = {k: self.value(value_type, v, join_path(path, k), _NO_RULE) for k, v in data.items()}
        return items if tp is dict or typing.get_origin(tp) is dict else FrozenMap(items)

    def scalar(self, tp: type, data: Any, path: str) -> Any:
        if not _fits(tp, data):
            raise SchemaError(path, f"must be {_TYPE_NAMES.get(tp, tp.__name__)}, got {describe(data)}")
        if tp is float:
            if not math.isfinite(data):
                raise SchemaError(path, f"must be a finite number, got {data}")
            return float(data)
        if isinstance(data, str) and not self.blank_text and not data.strip():
            raise SchemaError(path, "must not be empty")
        if tp is Path:
            return self.path(data, path)
        return data

    def path(self, text: str, path: str) -> Path:
        if self.base is None:
            raise TypeError("decoding a Path needs the folder relative paths are resolved against")
        resolved = Path(os.path.normpath(self.base / Path(text).expanduser()))
        if len(str(resolved)) > MAX_PATH_CHARS or any(len(part.encode()) > 255 for part in resolved.parts):
            raise SchemaError(path, "is too long for a path")
        return resolved

    def count(self, data: list | dict, path: str, limits: Rule) -> None:
        if limits.max_items is not None and len(data) > limits.max_items:
            raise SchemaError(path, f"has {len(data)} elements, more than the {limits.max_items} allowed")

    def check(self, value: Any, path: str, limits: Rule) -> None:
        if limits.allowed is not None and value not in limits.allowed:
            raise SchemaError(path, f"'{value}' is not allowed (allowed: {', '.join(map(str, limits.allowed))})")
        if limits.positive and value <= 0:
            raise SchemaError(path, f"must be positive, got {value}")
        if limits.minimum is not None and value < limits.minimum:
            raise SchemaError(
                path,
                f"must be zero or more, got {value}"
                if limits.minimum == 0
                else f"must be at least {limits.minimum:g}, got {value:g}",
            )
        if limits.maximum is not None and value > limits.maximum:
            raise SchemaError(path, f"must be at most {limits.maximum:g}, got {value:g}")
        if limits.between is not None and not limits.between[0] <= value <= limits.between[1]:
            low, high = limits.between
            raise SchemaError(path, f"must be between {low:g} and {high:g}, got {value:g}")
        problem = limits.check(value) if limits.check else None
        if problem:
            raise SchemaError(path, problem)


def field_default(field: dataclasses.Field) -> Any:
    """The value of `field` when its key is absent (or null), or MISSING if it is required."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _fits(tp: type, data: Any) -> bool:
    if dataclasses.is_dataclass(tp):
        return isinstance(data, dict)
    if tp is float:
        return isinstance(data, (int, float)) and not isinstance(data, bool)
    if tp is int:
        return isinstance(data, int) and not isinstance(data, bool)
    if tp is Path:
        return isinstance(data, str)
    return isinstance(data, tp)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A record type's field types, resolved once (most of the cost of decoding a large state file)."""
    return typing.get_type_hints(cls)
