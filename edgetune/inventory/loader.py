"""Load and validate fleet.yaml (and, through `profiles.py`, the device profiles it names).

The file is read into plain data (`reader.read_yaml`) and decoded straight into the `schema`
records, whose fields, types and `rule`s say what each value may be (`codec.decode`), and whose
`record_problem`s say what their values may not say of each other (told here at their YAML
paths). Here is the rest: what the file spells otherwise than the records hold it (a class's
profile file, a board's tracker and the ssh settings it inherits, input values, `compute`,
`deploy.tls`, `early_stop: false`), paths resolved against fleet.yaml, the files the inventory
names (`local_files.py`) and each class's tuning pool. Every problem is an `InventoryError` naming the file, the YAML path and what is
allowed. Nothing outside the inventory files is changed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import SchemaError, decode, to_json
from edgetune.errors import InventoryError
from edgetune.inventory.fields import label_key_problem, label_value_problem, pin_problem
from edgetune.inventory.inputs import check_dimensions, check_reference_input, with_values
from edgetune.inventory.local_files import (
    check_artifact_keys,
    check_directory,
    check_existing_file,
    check_ssh_entry,
    check_ssh_files,
    resolve_path,
)
from edgetune.inventory.profiles import load_profile
from edgetune.inventory.reader import Node, check_version, read_yaml
from edgetune.inventory.schema import (
    LOCAL_COMPUTE,
    NO_SSH_CONFIG,
    SCHEMA_VERSION,
    Board,
    DeploySettings,
    DeviceClass,
    Fleet,
    Model,
    Problem,
    RayCompute,
    SshSettings,
    TlsFiles,
    TuningPolicy,
)
from edgetune.inventory.selectors import pool_members

__all__ = ["load_fleet", "load_profile", "with_ray_compute"]
_SECRET_KEYS = ("password", "passphrase", "secret")


def load_fleet(path: str | Path) -> Fleet:
    """Read fleet.yaml and every profile it names; raise InventoryError on the first problem."""
    path = Path(os.path.abspath(path))
    root = Node(read_yaml(path), path)
    check_version(root, SCHEMA_VERSION)
    _refuse_secrets(root)
    base = path.parent
    fleet = Node(_as_records(root, base), path).decode(Fleet, base)
    _check_records(root, fleet)
    check_directory(root.child("workdir"), base / fleet.workdir)
    check_ssh_entry(root.child("ssh"), base)
    ssh = _ssh_settings((root.child("ssh"),), SshSettings(), fleet.ssh, base)
    fleet = fleet.replace(path=path, workdir=base / fleet.workdir, ssh=ssh)
    fleet = fleet.replace(boards=_boards(root, fleet, base))
    fleet = fleet.replace(
        models=tuple(_model(root.child("models").child(index), model) for index, model in enumerate(fleet.models)),
        tuning=_early_stop_off(root.child("tuning"), fleet.tuning),
        deploy=_deploy(root.child("deploy"), fleet),
    )
    check_artifact_keys(root.child("artifacts"), fleet.artifacts)
    _raise_problem(root, fleet.class_without_boards())
    fleet = fleet.replace(device_classes=_tuning_pools(root.child("device_classes"), fleet))
    check_ssh_files(root, fleet)
    return fleet


def with_ray_compute(fleet: Fleet, address: str, option: str = "--ray") -> Fleet:
    """`fleet` tuned on the Ray cluster at `address` (its other `compute.ray` settings as
    fleet.yaml gives them, else their defaults): the command line's override of `compute`."""
    given = to_json(fleet.compute) if fleet.compute is not None else {}
    try:
        return fleet.replace(compute=decode(RayCompute, {**given, "address": address}))
    except SchemaError as err:
        raise InventoryError(f"{option}: {err.message}") from None


def _refuse_secrets(root: Node) -> None:
    """Secrets are never read from YAML: a key that looks like one is refused before anything
    else is said about it."""
    for node in [root.child("ssh"), *(board.child("ssh") for board in root.child("boards").items())]:
        for key in node.value if isinstance(node.value, dict) else ():
            if any(secret in str(key).lower() for secret in _SECRET_KEYS) and key != "passphrase_env":
                raise node.child(str(key)).error(
                    "secrets are never read from YAML; use key-based auth, and name an environment variable "
                    "holding the key's passphrase in passphrase_env"
                )


# -- what the file spells otherwise than the records hold it ----------------------------------
def _as_records(root: Node, base: Path) -> dict[str, Any]:
    """fleet.yaml's data with what the records hold otherwise put in its place, or withheld
    (and derived once the records are decoded): `version` is checked already."""
    trackers = [t.child("name").value for t in root.child("trackers").items()]
    tuning, compute = root.child("tuning"), _compute(root.child("compute"))
    data = root.with_(
        "version",
        "compute",
        trackers=root.child("trackers").each(_tracker),
        ssh=root.child("ssh").with_("config"),
        device_classes=root.child("device_classes").each(lambda c: _device_class(c, base)),
        boards=root.child("boards").each(lambda b: _board(b, trackers)),
        models=root.child("models").each(lambda m: m.with_(inputs=m.child("inputs").each(_input))),
        tuning=tuning.with_(*_early_stop_withheld(tuning.child("early_stop"))),
        deploy=root.child("deploy").with_("tls"),
    )
    return {**data, "compute": compute} if compute is not None else data


def _tracker(node: Node) -> Any:
    """A tracker's ports: `port_end` defaults to port + 9."""
    port = node.child("port").value
    if node.child("port_end").value is not None or isinstance(port, bool) or not isinstance(port, int):
        return node.value
    return node.with_(port_end=min(port + 9, 65535))


def _device_class(node: Node, base: Path) -> Any:
    """A class with the profile its file holds in place of the file's name."""
    _check_as_written(node.child("pin"), pin_problem)
    profile = node.child("profile")
    if not isinstance(node.value, dict) or profile.value is None:
        return node.value
    path = resolve_path(profile, base)
    check_existing_file(profile, path, "profile file")
    return node.with_(profile=load_profile(path))


def _check_as_written(node: Node, problem: Callable[[Any, Any], str | None]) -> None:
    """Each key and value of the mapping at `node` as the file writes them (a number is no string)."""
    for key, value in node.value.items() if isinstance(node.value, dict) else ():
        said = problem(key, value)
        if said:
            raise node.child(str(key)).error(said)


def _input(node: Node) -> Any:
    """An input, its values withheld: they are read once its dtype is known."""
    check_dimensions(node.child("shape"))
    return node.with_("values")


def _board(node: Node, trackers: list[Any]) -> Any:
    """A board's labels and pins are checked as written (a number is no string); its tracker may be
    left out when the fleet has one; its ssh config file is read once the section is decoded."""
    _check_as_written(node.child("labels"), lambda key, value: label_key_problem(key) or label_value_problem(value))
    _check_as_written(node.child("pin"), pin_problem)
    tracker = node.child("tracker").value
    if tracker is None and len(trackers) > 1:
        raise node.child("tracker").error(
            f"required when the fleet has several trackers (declared: {', '.join(map(str, trackers))})"
        )
    return node.with_(
        tracker=trackers[0] if tracker is None and trackers else tracker, ssh=node.child("ssh").with_("config")
    )


def _early_stop_withheld(node: Node) -> tuple[str, ...]:
    """`early_stop: false` (tune every task to its budget) is withheld: the policy's None, set once
    it is decoded; `true` says nothing."""
    if node.value is True:
        raise node.error(
            "must be a mapping with keys window, min_gain, or false to tune every task to its budget, got true"
        )
    return ("early_stop",) if node.value is False else ()


def _compute(node: Node) -> RayCompute | None:
    """`compute`: `local` (everything on this host), or `{ray: {...}}` (docs/compute.md)."""
    if node.value is None or node.value == LOCAL_COMPUTE:
        return None
    if isinstance(node.value, str):
        raise node.error(
            f"'{node.value}' is not allowed (allowed: {LOCAL_COMPUTE}, or a mapping "
            "ray: {address: HOST:PORT, ...}; see docs/compute.md)"
        )
    node.check_keys(["ray"])
    return node.child("ray").decode(RayCompute)


# -- what is derived from the decoded records ----------------------------------------------------
def _boards(root: Node, fleet: Fleet, base: Path) -> tuple[Board, ...]:
    node = root.child("boards")
    boards = []
    for index, board in enumerate(fleet.boards):
        item = node.child(index)
        check_ssh_entry(item.child("ssh"), base)
        boards.append(
            dataclasses.replace(
                board,
                python=_board_path(item.child("python"), board, base),
                workdir=_board_path(item.child("workdir"), board, base, folder=True),
                ssh=_ssh_settings(
                    (item.child("ssh"), root.child("ssh")), fleet.ssh, board.ssh, base, board.simulated is None
                ),
            )
        )
    return tuple(boards)


def _ssh_settings(
    sections: tuple[Node, ...], inherited: SshSettings, own: SshSettings, base: Path, home_config: bool = False
) -> SshSettings:
    """`own` (decoded from the first of the ssh `sections`) where that section gives a value, else
    `inherited`. The config file (withheld from decoding) is the first section's that names one:
    `none` is none; where none names one, ~/.ssh/config if `home_config` (a board that is not
    simulated reads it, as ssh would) and there is one."""
    given = [k for k, v in sections[0].value.items() if v is not None] if isinstance(sections[0].value, dict) else []
    settings = dataclasses.replace(inherited, **{key: getattr(own, key) for key in given if key != "config"})
    spelled = next((s.child("config") for s in sections if s.child("config").value is not None), None)
    if spelled is None:
        home = Path.home() / ".ssh" / "config"
        return dataclasses.replace(settings, config=home if home_config and home.is_file() else None)
    return dataclasses.replace(settings, config=None if spelled.value == NO_SSH_CONFIG else resolve_path(spelled, base))


def _early_stop_off(node: Node, policy: TuningPolicy) -> TuningPolicy:
    return dataclasses.replace(policy, early_stop=None) if node.child("early_stop").value is False else policy


def _check_records(root: Node, fleet: Fleet) -> None:
    """What the values of each record say of each other (`record_problem`), told at its place."""
    problems = [(root, fleet.record_problem()), (root.child("tuning"), fleet.tuning.record_problem())]
    problems += [
        (root.child("trackers").child(index), tracker.record_problem()) for index, tracker in enumerate(fleet.trackers)
    ]
    problems += [
        (root.child("models").child(index), model.record_problem()) for index, model in enumerate(fleet.models)
    ]
    problems += [(root.child("deploy"), fleet.deploy.record_problem())] if fleet.deploy is not None else []
    for node, problem in problems:
        _raise_problem(node, problem)


def _raise_problem(root: Node, problem: Problem | None) -> None:
    if problem is not None:
        keys, message = problem
        raise functools.reduce(Node.child, keys, root).error(message)


def _board_path(node: Node, board: Board, base: Path, folder: bool = False) -> str:
    """A path on the board. Simulated x86 boards share this machine's files, so relative paths
    are resolved against fleet.yaml's folder (and a `folder` must be one, or makeable); real
    and emulated boards (which have a root file system of their own) need absolute paths."""
    if board.simulated is None or board.emulated:
        if not node.value.startswith("/"):
            raise node.error(f"must be an absolute path on the board, got '{node.value}'")
        return str(node.value)
    path = resolve_path(node, base)
    if folder:
        check_directory(node, path)
    return str(path)


def _model(item: Node, model: Model) -> Model:
    """The model's files; its inputs with their values; quantized_weights of ONNX models only."""
    if model.onnx is not None:  # its graph is read and checked by `edgetune check` (compiler.models.onnx_inputs)
        check_existing_file(item.child("onnx"), model.onnx, "ONNX file")
    model = dataclasses.replace(model, inputs=with_values(item.child("inputs"), model.inputs, model.builtin is None))
    if model.builtin is not None and item.child("quantized_weights").value is not None:
        raise item.child("quantized_weights").error("applies to ONNX models only (a builtin model has float32 weights)")
    if model.reference_input is not None:
        check_existing_file(item.child("reference_input"), model.reference_input, "reference input file")
        check_reference_input(item.child("reference_input"), model.reference_input, model.inputs)
    return model


def _deploy(node: Node, fleet: Fleet) -> DeploySettings | None:
    deploy = fleet.deploy
    if deploy is None:
        return None
    tls = node.child("tls").decode(bool) if node.child("tls").value is not None else True
    _check_url_scheme(node.child("url"), deploy.url, tls)
    if node.child("tokens_dir").value is not None:
        check_directory(node.child("tokens_dir"), deploy.tokens_dir)
    tokens_dir = fleet.workdir / deploy.tokens_dir  # a relative default is inside the workdir
    host, _, port = deploy.bind.rpartition(":")
    return dataclasses.replace(
        deploy,
        bind_host=host,
        port=int(port),
        url=deploy.url.rstrip("/"),
        tokens_dir=tokens_dir,
        tls=TlsFiles.beside(fleet.artifacts.signing_key) if tls else None,
    )


def _check_url_scheme(node: Node, url: str, tls: bool) -> None:
    """HTTPS unless `tls: false` was asked for, and then plain HTTP (the URL says what is spoken)."""
    if tls and not url.startswith("https://"):
        raise node.error(
            f"'{url}' is plain HTTP, but the server speaks HTTPS (deploy.tls is on by default): write "
            f"{url.replace('http://', 'https://', 1)}, or set deploy.tls: false to send tokens in clear"
        )
    if not tls and not url.startswith("http://"):
        raise node.error(
            f"'{url}' is HTTPS, but deploy.tls is false: write {url.replace('https://', 'http://', 1)}, or drop tls: false"
        )


def _tuning_pools(node: Node, fleet: Fleet) -> tuple[DeviceClass, ...]:
    """Each class with the names of the boards its `tuning_pool` names or selects, in inventory
    order (None where it has none: every board of the class tunes)."""
    classes = []
    for index, device_class in enumerate(fleet.device_classes):
        if device_class.tuning_pool is not None:
            own, chosen = fleet.boards_of(device_class.name), set()
            for place, item in enumerate(device_class.tuning_pool):
                try:
                    chosen |= pool_members(item, own, fleet.boards)
                except InventoryError as err:
                    raise node.child(index).child("tuning_pool").child(place).error(str(err)) from None
            device_class = dataclasses.replace(device_class, tuning_pool=tuple(b.name for b in own if b.name in chosen))
        classes.append(device_class)
    return tuple(classes)
