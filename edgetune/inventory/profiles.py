"""Load and validate a device profile (YAML) into a `schema.DeviceProfile`.

The file is decoded straight into the record (every key, type, range and allowed value); what
stays here is what a schema cannot say: the retired cache-flush setting, the TVM target's
options (typed where edgetune reads them; TVM checks the rest when `edgetune check` builds the
target) and the free-form `hardware` facts, kept few and shallow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import FrozenMap
from edgetune.inventory.reader import Node, check_version, read_yaml
from edgetune.inventory.schema import MAX_THREADS, SCHEMA_VERSION, DeviceProfile

MAX_HARDWARE_VALUES = 256
MAX_HARDWARE_DEPTH = 8
_TARGET_STRINGS = ("kind", "mcpu", "mtriple", "mabi", "mfloat-abi", "model")
_TARGET_COUNTS = {"num-cores": (1, MAX_THREADS), "opt-level": (0, 3)}
_TARGET_INT_LIMIT = 2**31 - 1
HOST_COMPILER = "host"  # `cross_compiler: host`


def load_profile(path: Path) -> DeviceProfile:
    root = Node(read_yaml(path), path)
    check_version(root, SCHEMA_VERSION)
    _refuse_cache_flush(root.child("measurement"))
    data = {
        key: value for key, value in root.value.items() if key != "version" and value is not None
    }  # null: not given
    profile = Node(data, path).decode(DeviceProfile, path.parent)
    return dataclasses.replace(
        profile,
        path=path,
        target=_target(root.child("target"), profile.target),
        cross_compiler=None if profile.cross_compiler == HOST_COMPILER else profile.cross_compiler,
        hardware=_hardware(root.child("hardware"), profile.hardware),
    )


def _refuse_cache_flush(node: Node) -> None:
    """`measurement.enable_cpu_cache_flush: true` is refused; false is still accepted (and dropped)."""
    if not isinstance(node.value, dict) or "enable_cpu_cache_flush" not in node.value:
        return
    flush = node.value.pop("enable_cpu_cache_flush")
    if flush is None:
        return
    Node(flush, node.file, node.child("enable_cpu_cache_flush").path).decode(bool)
    if flush:
        # TVM 0.27's flush (f_preproc cache_flush_cpu_non_first_arg) skips the first argument,
        # which for the VM's invoke_stateful is the function name: it never flushed anything.
        raise node.child("enable_cpu_cache_flush").error(
            "is no longer supported: TVM's flush touches only call arguments, once per repeat, so it "
            "flushed nothing for a whole model and one call in `number` when tuning; remove the line"
        )


def _target(node: Node, target: Mapping[str, Any]) -> FrozenMap:
    """The TVM target dict. The options edgetune reads are typed here (an empty `mcpu` would
    skip the CPU check); TVM itself checks the rest when `check` builds the target."""
    if "kind" not in target:
        raise node.child("kind").error("required field is missing (e.g. llvm)")
    options = {}
    for key, value in target.items():
        option = node.child(key)
        if key in _TARGET_COUNTS:
            low, high = _TARGET_COUNTS[key]
            value = option.decode(int)
            if not low <= value <= high:
                raise option.error(f"must be between {low:g} and {high:g}, got {value:g}")
        elif key in _TARGET_STRINGS or isinstance(value, str):
            value = option.decode(str)
        elif isinstance(value, list):
            if not all(isinstance(v, str) and v.strip() for v in value):
                raise option.error("a list option must hold strings (not empty), e.g. ['+neon']")
            value = tuple(value)
        elif not isinstance(value, (int, bool)):
            raise option.error(f"must be a string, integer, boolean or list of strings, got {value!r}")
        elif abs(value) > _TARGET_INT_LIMIT:
            raise option.error(f"must be between -{_TARGET_INT_LIMIT} and {_TARGET_INT_LIMIT}, got {value}")
        options[key] = value
    return FrozenMap(options)


def _hardware(node: Node, hardware: Mapping[str, Any]) -> FrozenMap:
    """Free-form facts (cores, caches, memory ...): plain JSON values, few and shallow, since
    they are part of the profile's digest in every manifest."""
    pending, count = [(node, 1)], 0
    while pending:
        item, depth = pending.pop()
        count += 1
        if count > MAX_HARDWARE_VALUES:
            raise node.error(f"holds more than {MAX_HARDWARE_VALUES} values; keep it to a few facts about the board")
        if depth > MAX_HARDWARE_DEPTH:
            raise item.error(f"is nested more than {MAX_HARDWARE_DEPTH} levels deep")
        if isinstance(item.value, dict):
            pending.extend((item.child(key), depth + 1) for key in item.value)
        elif isinstance(item.value, list):
            if len(item.value) > MAX_HARDWARE_VALUES:
                raise item.error(f"has {len(item.value)} elements, more than the {MAX_HARDWARE_VALUES} allowed")
            pending.extend((item.child(index), depth + 1) for index in range(len(item.value)))
    return FrozenMap(hardware)
