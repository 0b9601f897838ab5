"""Property: `edgetune verify` on a real artifact whose manifest.json or manifest.sig was changed
at a random JSON path (random values and types, deep nesting, NaN, huge numbers, bytes that are
not UTF-8) exits 5 naming the file, or 0 only if the change was re-signed and still valid;
never a traceback or another exit code."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edgetune.artifact_format.files import pack_tarball
from edgetune.artifact_format.signing import sign
from edgetune.cli import main

RAW = "@@raw-json-token@@"  # replaced by raw bytes after json.dumps
RAW_TOKENS = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 5_000 + b"0" + b"}" * 5_000,
    b"NaN",
    b"-Infinity",
    b"1e999",
    b"9" * 5_000,
    b'"\\ud800"',
    b'"\xff\xfe"',
    b'{"a": 1, "a": 2}',
    b"[1,",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
mutations = st.one_of(
    st.tuples(st.just("set"), json_values),
    st.tuples(st.just("raw"), st.sampled_from(RAW_TOKENS)),
    st.tuples(st.just("delete"), st.none()),
    st.tuples(st.just("wrap"), st.text(max_size=8)),
)


def _json_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path (keys and indexes) in `value`, the root included."""
    found = [path]
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found += _json_paths(child, (*path, key))
    return found


def _mutated(tree: Any, path: tuple, mutation: tuple) -> bytes:
    kind, arg = mutation
    new = {"set": arg, "raw": RAW, "wrap": None, "delete": None}[kind]
    if kind == "wrap":  # the value moved one level down, under a new key
        new = {arg: _get(tree, path)}
    if not path:
        tree = {} if kind == "delete" else new
    else:
        parent = _get(tree, path[:-1])
        if kind == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = new
    data = json.dumps(tree).encode()
    return data.replace(json.dumps(RAW).encode(), arg) if kind == "raw" else data


def _get(tree: Any, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_verify_survives_any_change_to_manifest_or_signature(publish, make_manifest, keys, tmp_path, data):
    stored = publish(make_manifest()).stored
    public_key = tmp_path / "keys" / "signing.pub"
    name = data.draw(st.sampled_from(["manifest.json", "manifest.sig"]), label="file")
    original = json.loads((stored.path / name).read_bytes())
    path = data.draw(st.sampled_from(_json_paths(original)), label="path")
    mutation = data.draw(mutations, label="mutation")
    resign = name == "manifest.json" and data.draw(st.booleans(), label="re-signed")
    as_tarball = data.draw(st.booleans(), label="as tarball")
    changed = _mutated(json.loads((stored.path / name).read_bytes()), path, mutation)
    assume(mutation[0] == "raw" or json.loads(changed) != original)

    with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
        artifact = Path(scratch) / "v1"
        shutil.copytree(stored.path, artifact)
        (artifact / name).write_bytes(changed)
        if resign:
            (artifact / "manifest.sig").write_bytes(sign(keys[0], changed).to_bytes())
        if as_tarball:
            (Path(scratch) / "v1.tar.gz").write_bytes(pack_tarball(artifact))
            artifact = Path(scratch) / "v1.tar.gz"
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["verify", str(artifact), "--public-key", str(public_key)])

    message = err.getvalue()
    assert "Traceback" not in message
    if resign:
        assert code in (0, 5), message
        named = ("manifest.json", "manifest.sig", "model.so", "report/summary.json", "report/")
    else:
        assert code == 5, message
        named = ("manifest.json", "manifest.sig")
    assert code == 0 or any(n in message for n in named), message
