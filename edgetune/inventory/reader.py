"""A strict reader of YAML mappings that knows where it is.

`read_yaml` builds plain data (dict, list, str, int, float, bool, None) from a YAML file in
one pass over the parser's events, without recursion, and refuses what would break later,
each time naming the file and the YAML path (`fleet.yaml: boards[2].name: ...`): a file over
`MAX_FILE_BYTES` or not UTF-8, duplicate keys, keys that are not strings, tags beyond the
plain JSON types (dates stay text), integers beyond 2**53, NaN and infinities, control
characters, strings over `MAX_STRING_CHARS`, nesting deeper than `MAX_DEPTH`, and aliases
that expand to more than `MAX_VALUES` values (a "billion laughs").

The plain data is then decoded into the schema's records (`schema.py`, by `codec.decode`), which
names the file and the YAML path of any misfit; a `Node` is a place in the document for the
errors of the checks that span fields.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from yaml.constructor import SafeConstructor

from edgetune.artifact_format.codec import SchemaError, decode, describe, join_path
from edgetune.errors import InventoryError

MAX_FILE_BYTES = 1 << 20  # a fleet of thousands of boards is a few hundred KiB
MAX_DEPTH = 32  # the schema nests 5 levels; a profile's free-form `hardware` a few more
MAX_VALUES = MAX_FILE_BYTES  # values after expanding aliases: no alias-free file under the size cap has as many
MAX_STRING_CHARS = 4096
MAX_INT = 2**53  # JSON-safe; every count of the schema is far smaller
T = TypeVar("T")

_NO_KEY = object()
_MERGE = object()

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + name for name in ("null", "bool", "int", "float", "str")}
_COLLECTION_TAGS = {_TAG + "seq", _TAG + "map"}
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")
_UTF16_32_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")


class _Resolver(yaml.resolver.Resolver):
    """YAML 1.1's implicit types, except timestamps: `2024-05-01` stays the text it is."""

    yaml_implicit_resolvers: ClassVar[dict] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TAG + "timestamp"]
        for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
    }


_EventLoader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)


def display_path(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file into plain data; any problem is an InventoryError naming the file
    and, where there is one, the YAML path and line."""
    text = _read_text(path)
    try:
        return _Builder(path).build(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InventoryError(f"{display_path(path)}: YAML syntax error{where}: {problem}") from None


def _read_text(path: Path) -> str:
    """The file's text: a regular file of at most MAX_FILE_BYTES, UTF-8 encoded."""
    name = display_path(path)
    try:
        # non-blocking: a FIFO opens at once (and is refused below) instead of waiting for a writer
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
                raise InventoryError(f"{name}: is {kind}; give the path of a YAML file")
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise InventoryError(f"{name}: file does not exist") from None
    except IsADirectoryError:
        raise InventoryError(f"{name}: is a directory; give the path of a YAML file") from None
    except OSError as err:
        raise InventoryError(f"{name}: cannot be read ({err.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise InventoryError(f"{name}: is larger than {MAX_FILE_BYTES >> 20} MiB; an inventory is a few KiB of YAML")
    if data.startswith(_UTF16_32_BOMS) or b"\x00" in data:
        raise InventoryError(f"{name}: is UTF-16 or UTF-32 text, or binary (it holds NUL bytes); save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InventoryError(
            f"{name}: is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line} is invalid); save it as UTF-8"
        ) from None


class _Collection:
    """A sequence or mapping being built, while the parser is inside it."""

    def __init__(self, value: list | dict, path: str, anchor: str | None, start: int) -> None:
        self.value = value
        self.path = path
        self.anchor = anchor
        self.start = start  # values seen before this one began
        self.height = 1  # levels of nesting in this value, itself included
        self.key: Any = _NO_KEY  # a mapping's key waiting for its value
        self.key_lines: dict[str, int] = {}
        self.merges: list[dict] = []

    def child_path(self) -> str:
        if isinstance(self.value, list):
            return join_path(self.path, len(self.value))
        if self.key is _NO_KEY or self.key is _MERGE:
            return self.path
        return join_path(self.path, self.key)


class _Builder:
    """Plain data from YAML parser events: iterative, with the YAML path of every value."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.resolver = _Resolver()
        self.constructor = SafeConstructor()
        self.stack: list[_Collection] = []
        self.anchors: dict[str, tuple[Any, int, int]] = {}  # value, values, height
        self.open_anchors: set[str] = set()
        self.values = 0
        self.documents = 0
        self.root: Any = None

    def build(self, text: str) -> Any:
        loader = _EventLoader(text)
        try:
            while loader.check_event():
                self._event(loader.get_event())
        finally:
            loader.dispose()
        return self.root

    def _event(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise self._error(event, "", "holds more than one YAML document")
        elif isinstance(event, yaml.ScalarEvent):
            self._count(event, 1)
            value = self._scalar(event)
            self._remember(event.anchor, value, 1, 0)
            self._deliver(event, value, 0)
        elif isinstance(event, yaml.AliasEvent):
            self._alias(event)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self._open(event)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            self._close(event)

    # -- values ------------------------------------------------------------------------------
    def _scalar(self, event: yaml.ScalarEvent) -> Any:
        path = self._next_path()
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _TAG + "merge":  # `<<` merges only as a key; elsewhere it is text
            if self._expecting_key():
                return _MERGE
            tag = _TAG + "str"
        if tag not in _SCALAR_TAGS:
            raise self._error(
                event, path, f"the tag {tag} is not allowed here (only strings, numbers, booleans and null)"
            )
        if tag == _TAG + "int" and len(event.value) > 64:
            raise self._error(event, path, f"the integer {event.value[:20]}... is too large")
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark)
        try:
            value = self.constructor.yaml_constructors[tag](self.constructor, node)
        except (ValueError, yaml.YAMLError):
            raise self._error(event, path, f"{event.value[:40]!r} is not a valid {tag[len(_TAG) :]}") from None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise self._error(event, path, f"the integer {value} is too large (at most 2**53)")
        if isinstance(value, float) and not math.isfinite(value):
            raise self._error(event, path, f"must be a finite number, got {event.value}")
        if isinstance(value, str):
            self._check_string(event, path, value)
        return value

    def _check_string(self, event: yaml.Event, path: str, value: str) -> None:
        if len(value) > MAX_STRING_CHARS:
            raise self._error(
                event, path, f"a string of {len(value)} characters is too long (at most {MAX_STRING_CHARS})"
            )
        bad = _CONTROL_CHARS.search(value)
        if bad:
            raise self._error(
                event, path, f"holds the control character or invalid code point U+{ord(bad.group()):04X}"
            )

    def _alias(self, event: yaml.AliasEvent) -> None:
        path = self._next_path()
        if event.anchor in self.open_anchors:
            raise self._error(event, path, f"the alias *{event.anchor} refers to a value that contains it")
        if event.anchor not in self.anchors:
            raise self._error(event, path, f"the alias *{event.anchor} has no anchor &{event.anchor} before it")
        value, values, height = self.anchors[event.anchor]
        self._count(event, values)
        self._deliver(event, value, height)

    def _open(self, event: yaml.CollectionStartEvent) -> None:
        path = self._next_path()
        if self._expecting_key():
            raise self._error(event, path, "a mapping key must be a string, not a list or mapping")
        if event.tag not in (None, "!") and event.tag not in _COLLECTION_TAGS:
            raise self._error(event, path, f"the tag {event.tag} is not allowed here (only plain lists and mappings)")
        if len(self.stack) >= MAX_DEPTH:
            raise self._error(event, path, f"is nested too deeply (more than {MAX_DEPTH} levels)")
        self._count(event, 1)
        value: list | dict = [] if isinstance(event, yaml.SequenceStartEvent) else {}
        self.stack.append(_Collection(value, path, event.anchor, self.values))
        if event.anchor is not None:
            self.open_anchors.add(event.anchor)

    def _close(self, event: yaml.CollectionEndEvent) -> None:
        done = self.stack.pop()
        if isinstance(done.value, dict):
            for source in done.merges:
                for key, value in source.items():
                    done.value.setdefault(key, value)
        if done.anchor is not None:
            self.open_anchors.discard(done.anchor)
        self._remember(done.anchor, done.value, self.values - done.start + 1, done.height)
        self._deliver(event, done.value, done.height)

    def _remember(self, anchor: str | None, value: Any, values: int, height: int) -> None:
        if anchor is not None:
            self.anchors[anchor] = (value, values, height)

    def _deliver(self, event: yaml.Event, value: Any, height: int) -> None:
        """Put a finished value where it belongs: the root, a list, a mapping key or value."""
        if len(self.stack) + height > MAX_DEPTH:
            raise self._error(
                event, self._next_path(), f"is nested too deeply (more than {MAX_DEPTH} levels, aliases expanded)"
            )
        if not self.stack:
            self.root = value
            return
        parent = self.stack[-1]
        parent.height = max(parent.height, height + 1)
        if isinstance(parent.value, list):
            parent.value.append(value)
        elif parent.key is _NO_KEY:
            self._key(parent, event, value)
        else:
            if parent.key is _MERGE:
                parent.merges.extend(self._merge_sources(event, parent.path, value))
            else:
                parent.value[parent.key] = value
            parent.key = _NO_KEY

    def _key(self, parent: _Collection, event: yaml.Event, key: Any) -> None:
        if key is _MERGE:
            parent.key = _MERGE
            return
        if not isinstance(key, str):
            shown = "nothing" if key is None else repr(key)
            raise self._error(event, parent.path, f"the key {shown} is not a string; quote it")
        line = event.start_mark.line + 1
        if key in parent.key_lines:
            raise self._error(
                event,
                join_path(parent.path, key),
                f"duplicate key (first on line {parent.key_lines[key]}; the last would silently win)",
            )
        parent.key_lines[key] = line
        parent.key = key

    def _merge_sources(self, event: yaml.Event, path: str, value: Any) -> list[dict]:
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(source, dict) for source in sources):
            raise self._error(event, join_path(path, "<<"), "a merge key (<<) takes a mapping or a list of mappings")
        return sources

    # -- bookkeeping ---------------------------------------------------------------------------
    def _count(self, event: yaml.Event, values: int) -> None:
        self.values += values
        if self.values > MAX_VALUES:
            raise self._error(
                event,
                self._next_path(),
                f"the document expands to more than {MAX_VALUES} values (through YAML aliases?)",
            )

    def _expecting_key(self) -> bool:
        return bool(self.stack) and isinstance(self.stack[-1].value, dict) and self.stack[-1].key is _NO_KEY

    def _next_path(self) -> str:
        return self.stack[-1].child_path() if self.stack else ""

    def _error(self, event: yaml.Event, path: str, message: str) -> InventoryError:
        line = f" (line {event.start_mark.line + 1})" if event.start_mark else ""
        where = f"{display_path(self.file)}: {path}" if path else display_path(self.file)
        return InventoryError(f"{where}: {message}{line}")


class Node:
    """A place in a YAML document, its value and where it is, for the errors of the checks
    that span fields (the decoder names the places of the rest)."""

    def __init__(self, value: Any, file: Path, path: str = "") -> None:
        self.value = value
        self.file = file
        self.path = path

    def error(self, message: str) -> InventoryError:
        where = f"{display_path(self.file)}: {self.path}" if self.path else f"{display_path(self.file)}"
        return InventoryError(f"{where}: {message}")

    def decode(self, cls: type[T], base: Path | None = None) -> T:
        """This value decoded as `cls` (`codec.decode`; blank strings refused, relative paths
        resolved against `base`); a misfit is an InventoryError naming the file and YAML path."""
        try:
            return decode(cls, self.value, self.path, base=base, blank_text=False)
        except SchemaError as err:
            raise InventoryError(f"{display_path(self.file)}: {err}") from None

    def check_keys(self, allowed: list[str]) -> None:
        """This value is a mapping (or nothing) with keys of `allowed` only (which one was meant, where one is close)."""
        if self.value is not None and not isinstance(self.value, dict):
            raise self.error(f"must be a mapping with keys {', '.join(allowed)}, got {describe(self.value)}")
        for key in self.value or ():
            if key not in allowed:
                hint = difflib.get_close_matches(key, allowed, n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                raise self.child(key).error(f"unknown key{suggestion}; allowed here: {', '.join(allowed)}")

    def items(self) -> list[Node]:
        """The places of this list's items (none if it is not a list: the decoder says what it must be)."""
        return [self.child(index) for index in range(len(self.value))] if isinstance(self.value, list) else []

    def each(self, change: Callable[[Node], Any]) -> Any:
        """This list with `change` of each item's place in place of the item (anything else as it is)."""
        return [change(item) for item in self.items()] if isinstance(self.value, list) else self.value

    def with_(self, *withheld: str, **derived: Any) -> Any:
        """This mapping without the keys `withheld` and with the `derived` values in place of the
        file's (a key the file leaves out stays out unless a value is derived for it); anything
        else as it is, for the decoder to refuse."""
        if not isinstance(self.value, dict):
            return self.value
        kept = {k: v for k, v in self.value.items() if k not in withheld}
        return {**kept, **{k: v for k, v in derived.items() if v is not None or k in self.value}}

    def child(self, key: str | int) -> Node:
        """The place of `key` inside this mapping or list (its value None if absent)."""
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if isinstance(self.value, list) and isinstance(key, int) and key < len(self.value):
            value = self.value[key]
        return Node(value, self.file, join_path(self.path, key))


def check_version(root: Node, supported: int) -> None:
    if not isinstance(root.value, dict):
        raise root.error(f"must be a YAML mapping, got {describe(root.value)}")
    if "version" not in root.value:
        raise InventoryError(
            f"{display_path(root.file)}: version: required field is missing (this edgetune reads version: {supported})"
        )
    version = root.value["version"]
    if type(version) is not int or version != supported:
        raise InventoryError(
            f"{display_path(root.file)}: version: unsupported version {version!r} (this edgetune reads version: {supported})"
        )
