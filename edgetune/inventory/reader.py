"""A strict reader of YAML mappings that knows where it is.

Every value is read through a `Node`, which remembers the file and the YAML path it came from,
so that any error names both (`fleet.yaml: boards[2].device_class: ...`). Unknown keys are
refused with a did-you-mean suggestion.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterator

import yaml

from edgetune.errors import InventoryError

_MISSING = object()

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "a mapping",
    list: "a list",
}


def display_path(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error names the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{display_path(path)}: file does not exist") from None
    except OSError as err:
        raise InventoryError(f"{display_path(path)}: cannot be read ({err.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise InventoryError(f"{display_path(path)}: YAML syntax error{where}: {problem}") from None


class Node:
    """A value in a YAML document, with its file and path for error messages."""

    def __init__(self, value: Any, file: Path, path: str = "") -> None:
        self.value = value
        self.file = file
        self.path = path

    # -- errors -----------------------------------------------------------------------------
    def error(self, message: str) -> InventoryError:
        where = f"{display_path(self.file)}: {self.path}" if self.path else f"{display_path(self.file)}"
        return InventoryError(f"{where}: {message}")

    def _child_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    # -- shapes ---------------------------------------------------------------------------
    def mapping(self, allowed: tuple[str, ...]) -> "Node":
        """Assert this is a mapping whose keys are all in `allowed`."""
        if not isinstance(self.value, dict):
            raise self.error(f"must be a mapping with keys {', '.join(allowed)}, got {_describe(self.value)}")
        for key in self.value:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                raise InventoryError(
                    f"{display_path(self.file)}: {self._child_path(str(key))}: unknown key{suggestion}; "
                    f"allowed here: {', '.join(allowed)}"
                )
        return self

    def items(self) -> Iterator["Node"]:
        """The elements of a list."""
        if not isinstance(self.value, list):
            raise self.error(f"must be a list, got {_describe(self.value)}")
        for index, element in enumerate(self.value):
            yield Node(element, self.file, self._child_path(index))

    def child(self, key: str, default: Any = _MISSING) -> "Node":
        if key not in self.value or self.value[key] is None:
            if default is _MISSING:
                raise InventoryError(f"{display_path(self.file)}: {self._child_path(key)}: required field is missing")
            return Node(default, self.file, self._child_path(key))
        return Node(self.value[key], self.file, self._child_path(key))

    def has(self, key: str) -> bool:
        return self.value.get(key) is not None

    # -- scalars --------------------------------------------------------------------------
    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        """A scalar field of this mapping, checked against `kind`."""
        node = self.child(key, default)
        if node.value is default and default is not _MISSING:
            return default
        return node.scalar(kind)

    def scalar(self, kind: type) -> Any:
        value = self.value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if kind is int and isinstance(value, bool):
            raise self.error(f"must be {_TYPE_NAMES[kind]}, got {_describe(value)}")
        if not isinstance(value, kind):
            raise self.error(f"must be {_TYPE_NAMES[kind]}, got {_describe(value)}")
        if kind is str and not value.strip():
            raise self.error("must not be empty")
        return value

    def positive(self, key: str, kind: type = int, default: Any = _MISSING) -> Any:
        value = self.get(key, kind, default)
        if value is not None and value <= 0:
            raise self.child(key).error(f"must be positive, got {value}")
        return value

    def non_negative(self, key: str, kind: type = int, default: Any = _MISSING) -> Any:
        value = self.get(key, kind, default)
        if value is not None and value < 0:
            raise self.child(key).error(f"must be zero or more, got {value}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: Any = _MISSING) -> Any:
        value = self.get(key, str, default)
        if value is not None and value not in allowed:
            raise self.child(key).error(f"'{value}' is not allowed (allowed: {', '.join(allowed)})")
        return value


def check_version(root: Node, supported: int) -> None:
    if not isinstance(root.value, dict):
        raise root.error(f"must be a YAML mapping, got {_describe(root.value)}")
    if "version" not in root.value:
        raise InventoryError(f"{display_path(root.file)}: version: required field is missing (this edgetune reads version: {supported})")
    version = root.value["version"]
    if version != supported or isinstance(version, bool):
        raise InventoryError(
            f"{display_path(root.file)}: version: unsupported version {version!r} (this edgetune reads version: {supported})"
        )


def check_unique(nodes: list[Node], field: str, what: str) -> None:
    seen: dict[str, str] = {}
    for node in nodes:
        name = node.value.get(field) if isinstance(node.value, dict) else None
        if name in seen:
            raise node.child(field).error(f"duplicate {what} '{name}' (first defined at {seen[name]})")
        if name is not None:
            seen[name] = node._child_path(field)


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    kind = "boolean" if isinstance(value, bool) else type(value).__name__
    return f"{kind} {value!r}"
