"""Load and validate fleet.yaml (and, through `profiles.py`, the device profiles it names)
into `schema` records.

The file is read into plain data (`reader.read_yaml`) and decoded against its schema
(`documents.FleetFile`: every key, type, range and allowed value, by `codec.decode`). What a
schema of one value cannot say is checked here, after decoding: unique names, declared classes,
trackers and models, the ssh settings a board inherits, simulated boards in the simulated
network, each class's tuning pool (board names and selectors of its own boards), model inputs
against their dtype, the tuning budget rules, the deploy URL against TLS;
`local_files.py` checks the files and folders the inventory names (paths relative to
fleet.yaml). Every problem is an `InventoryError` naming the file, the YAML path and what is
allowed. Nothing outside the inventory files is changed.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import FrozenMap, SchemaError, decode, to_json
from edgetune.errors import InventoryError
from edgetune.inventory.documents import (
    ArtifactsEntry,
    BoardEntry,
    ClassEntry,
    ComputeEntry,
    DeployEntry,
    FleetFile,
    InputEntry,
    InputValues,
    ModelEntry,
    SshEntry,
    TrackerEntry,
    TuningEntry,
)
from edgetune.inventory.fields import address_problem, label_key_problem, label_value_problem
from edgetune.inventory.local_files import (
    check_directory,
    check_existing_file,
    check_file,
    check_ssh_entry,
    check_ssh_files,
    resolve_path,
)
from edgetune.inventory.profiles import load_profile
from edgetune.inventory.reader import Node, check_version, read_yaml
from edgetune.inventory.reference_input import check_reference_input
from edgetune.inventory.schema import (
    MAX_TRIALS,
    NO_SSH_CONFIG,
    SCHEMA_VERSION,
    ArtifactSettings,
    Board,
    DeploySettings,
    DeviceClass,
    FixedValue,
    Fleet,
    Model,
    ModelInput,
    RayCompute,
    SimSettings,
    Simulation,
    SshSettings,
    TlsFiles,
    Tracker,
    TuningPolicy,
    ValueRange,
)
from edgetune.inventory.selectors import board_value, parse_selector
from edgetune.inventory.workdir import Workdir

__all__ = ["load_fleet", "load_profile", "with_ray_compute"]
_SECRET_KEYS = ("password", "passphrase", "secret")
INTEGER_LIMITS = {"int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
FLOAT_LIMITS = {"float16": 65504.0, "float32": 3.4028234663852886e38}
MAX_ELEMENTS = 2**31 - 1  # per input tensor, and per dimension
POOL_NAMES_SHOWN = 10  # board names an error about a tuning pool lists


def load_fleet(path: str | Path) -> Fleet:
    """Read fleet.yaml and every profile it names; raise InventoryError on the first problem."""
    path = Path(os.path.abspath(path))
    root = Node(read_yaml(path), path)
    check_version(root, SCHEMA_VERSION)
    _refuse_secrets(root)
    base = path.parent
    doc = root.decode(FleetFile, base)
    workdir = doc.workdir or base / ".edgetune"
    check_directory(root.child("workdir"), workdir)
    trackers = _trackers(root.child("trackers"), doc.trackers)
    check_ssh_entry(root.child("ssh"), doc.ssh, base)
    classes = _device_classes(root.child("device_classes"), doc.device_classes)
    boards = _boards(root, doc, base, classes, trackers)
    artifacts = _artifacts(root.child("artifacts"), doc.artifacts)
    fleet = Fleet(
        path=path,
        name=doc.name,
        workdir=workdir,
        trackers=trackers,
        device_classes=classes,
        boards=boards,
        models=_models(root.child("models"), doc.models),
        tuning=_tuning(root.child("tuning"), doc.tuning, classes),
        artifacts=artifacts,
        sim=doc.sim,
        deploy=_deploy(root.child("deploy"), doc.deploy, workdir, artifacts),
        regress=doc.regress,
        compute=doc.compute.ray if isinstance(doc.compute, ComputeEntry) else None,
    )
    _check_classes_have_boards(root, fleet)
    fleet = fleet.replace(device_classes=_tuning_pools(root.child("device_classes"), doc.device_classes, fleet))
    check_ssh_files(root, fleet)
    _check_pins(root, fleet)
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
    boards = root.child("boards")
    count = len(boards.value) if isinstance(boards.value, list) else 0
    for node in [root.child("ssh"), *(boards.child(i).child("ssh") for i in range(count))]:
        for key in node.value if isinstance(node.value, dict) else ():
            if any(secret in str(key).lower() for secret in _SECRET_KEYS) and key != "passphrase_env":
                raise node.child(str(key)).error(
                    "secrets are never read from YAML; use key-based auth, and name an environment variable "
                    "holding the key's passphrase in passphrase_env"
                )


def _unique(parent: Node, items: tuple[Any, ...], field: str, what: str) -> None:
    """No two of `items` have the same `field`."""
    seen: dict[Any, str] = {}
    for index, item in enumerate(items):
        value, where = getattr(item, field), parent.child(index).child(field)
        if value in seen:
            raise where.error(f"duplicate {what} '{value}' (first defined at {seen[value]})")
        seen[value] = where.path


def _declared(node: Node, value: str, names: list[str], what: str) -> None:
    if value not in names:
        raise node.error(f"'{value}' is not a declared {what} (declared: {', '.join(names)})")


# -- fleet sections ---------------------------------------------------------------------------
def _trackers(node: Node, entries: tuple[TrackerEntry, ...]) -> tuple[Tracker, ...]:
    _unique(node, entries, "name", "tracker")
    trackers = []
    for index, entry in enumerate(entries):
        port_end = entry.port_end if entry.port_end is not None else min(entry.port + 9, 65535)
        if port_end < entry.port:
            raise node.child(index).child("port_end").error(f"must be at least port ({entry.port}), got {port_end}")
        trackers.append(Tracker(entry.name, entry.bind_host, entry.public_address, entry.port, port_end))
    return tuple(trackers)


def _ssh_settings(fleet_ssh: SshEntry, board_ssh: SshEntry, base: Path, simulated: bool) -> SshSettings:
    """A board's ssh settings: its own where given, else the fleet's, else the defaults. A board
    for which no ssh config file is named reads ~/.ssh/config, if there is one, as ssh would; a
    simulated board none: it is reached directly on the bridge made for it."""
    given = {f.name: _first(getattr(board_ssh, f.name), getattr(fleet_ssh, f.name)) for f in dataclasses.fields(SshEntry)}
    config = given.pop("config")
    home = Path.home() / ".ssh" / "config"
    if config is None:
        config_path = home if not simulated and home.is_file() else None
    else:
        config_path = None if config == NO_SSH_CONFIG else decode(Path, config, base=base)  # checked by check_ssh_entry
    return dataclasses.replace(SshSettings(), config=config_path, **{k: v for k, v in given.items() if v is not None})


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _device_classes(node: Node, entries: tuple[ClassEntry, ...]) -> tuple[DeviceClass, ...]:
    _unique(node, entries, "name", "device class")
    classes = []
    for index, entry in enumerate(entries):
        check_existing_file(node.child(index).child("profile"), entry.profile, "profile file")
        pin = _pin(node.child(index).child("pin"), entry.pin)
        classes.append(DeviceClass(name=entry.name, profile=load_profile(entry.profile), pin=pin))
    return tuple(classes)


def _boards(root: Node, doc: FleetFile, base: Path, classes: tuple[DeviceClass, ...], trackers: tuple[Tracker, ...]) -> tuple[Board, ...]:
    node = root.child("boards")
    _unique(node, doc.boards, "name", "board")
    _unique(node, doc.boards, "address", "board address")
    boards = []
    for index, entry in enumerate(doc.boards):
        item = node.child(index)
        _declared(item.child("device_class"), entry.device_class, [c.name for c in classes], "device class")
        if entry.simulated is not None:
            _check_simulated(item, entry, doc.sim, next(c for c in classes if c.name == entry.device_class))
        check_ssh_entry(item.child("ssh"), entry.ssh, base)
        boards.append(
            Board(
                name=entry.name,
                address=entry.address,
                device_class=entry.device_class,
                tracker=_board_tracker(item.child("tracker"), entry.tracker, [t.name for t in trackers]),
                python=_board_path(item.child("python"), entry.python, base, entry.simulated),
                workdir=_board_workdir(item.child("workdir"), entry.workdir, base, entry.simulated),
                ssh=_ssh_settings(doc.ssh, entry.ssh, base, entry.simulated is not None),
                threads=entry.threads,
                simulated=entry.simulated,
                pin=_pin(item.child("pin"), entry.pin),
                token_env=entry.token_env,
                labels=_labels(item.child("labels"), entry.labels),
            )
        )
    _check_own_token_variables(node, boards)
    return tuple(boards)


def _labels(node: Node, labels: Mapping[Any, Any]) -> FrozenMap:
    """A board's labels: short names (not `class` or `board`, which selectors use) to short string values."""
    for key, value in labels.items():
        problem = label_key_problem(key)
        if problem:
            raise node.child(str(key)).error(problem)
        problem = label_value_problem(value)
        if problem:
            raise node.child(key).error(problem)
    return FrozenMap(labels)


def _check_own_token_variables(node: Node, boards: list[Board]) -> None:
    """No two boards read their download token from the same variable: they would share one."""
    first_reader: dict[str, str] = {}
    for index, board in enumerate(boards):
        if board.token_env is None:
            continue
        if board.token_env in first_reader:
            raise node.child(index).child("token_env").error(
                f"${board.token_env} is also the token variable of board {first_reader[board.token_env]}: boards "
                f"{first_reader[board.token_env]} and {board.name} would share one download token; give each its own"
            )
        first_reader[board.token_env] = board.name


def _check_simulated(item: Node, entry: BoardEntry, sim: SimSettings | None, device_class: DeviceClass) -> None:
    """A simulated board needs the sim section and a free address in its network; an emulated
    one runs what its class's target compiles for, and nothing else."""
    if sim is None:
        raise item.child("simulated").error("a simulated board needs the top-level 'sim' section (bridge, host_address)")
    simulated = entry.simulated
    if simulated is None:  # not a simulated board: nothing to check
        return
    triple = str(device_class.profile.target.get("mtriple", ""))
    if simulated.emulated and not triple.startswith(simulated.arch):
        raise item.child("simulated").child("arch").error(
            f"an {simulated.arch} board needs a device class whose profile targets {simulated.arch}; class "
            f"'{device_class.name}' ({device_class.profile.path}) targets '{triple or 'the host'}'"
        )
    host = ipaddress.IPv4Interface(sim.host_address)
    network = host.network
    try:
        ip = ipaddress.IPv4Address(entry.address)
    except ValueError:
        raise item.child("address").error(f"a simulated board needs an IPv4 address in {network}, got '{entry.address}'") from None
    if ip not in network or ip in (host.ip, network.network_address, network.broadcast_address):
        raise item.child("address").error(f"'{entry.address}' is not a free board address in the simulated network {network}")


def _board_tracker(node: Node, tracker: str | None, tracker_names: list[str]) -> str:
    if tracker is None:
        if len(tracker_names) == 1:
            return tracker_names[0]
        raise node.error(f"required when the fleet has several trackers (declared: {', '.join(tracker_names)})")
    _declared(node, tracker, tracker_names, "tracker")
    return tracker


def _board_path(node: Node, value: str, base: Path, simulated: Simulation | None) -> str:
    """Paths on the board. Simulated x86 boards share this machine's files, so relative paths
    are resolved against fleet.yaml's folder; real and emulated boards (which have a root file
    system of their own) need absolute paths."""
    if simulated is not None and not simulated.emulated:
        return str(resolve_path(node, base))
    if not value.startswith("/"):
        raise node.error(f"must be an absolute path on the board, got '{value}'")
    return value


def _board_workdir(node: Node, value: str, base: Path, simulated: Simulation | None) -> str:
    """A simulated board's workdir is on this machine, so it must be a folder or makeable."""
    workdir = _board_path(node, value, base, simulated)
    if simulated is not None and not simulated.emulated:
        check_directory(node, Path(workdir))
    return workdir


def _models(node: Node, entries: tuple[ModelEntry, ...]) -> tuple[Model, ...]:
    _unique(node, entries, "name", "model")
    models = []
    for index, entry in enumerate(entries):
        item = node.child(index)
        if (entry.builtin is None) == (entry.onnx is None):
            raise item.error("give exactly one of 'builtin' (a reference model name) or 'onnx' (a file path)")
        if entry.onnx is not None:  # its graph is read and checked by `edgetune check` (compiler.models.onnx_inputs)
            check_existing_file(item.child("onnx"), entry.onnx, "ONNX file")
        inputs = _inputs(item.child("inputs"), entry.inputs, entry.builtin is None)
        if entry.builtin is not None and entry.quantized_weights is not None:
            raise item.child("quantized_weights").error("applies to ONNX models only (a builtin model has float32 weights)")
        if entry.quantized_weights == "integer" and entry.layout == "NCHW":
            raise item.child("quantized_weights").error(
                "'integer' computes convolutions in the NHWC micro-kernel; use 'layout: NHWC' or 'layout: auto' (layout is NCHW)")
        if entry.reference_input is not None:
            check_existing_file(item.child("reference_input"), entry.reference_input, "reference input file")
            check_reference_input(item.child("reference_input"), entry.reference_input, inputs)
        models.append(
            Model(
                name=entry.name,
                inputs=inputs,
                onnx=entry.onnx,
                builtin=entry.builtin,
                weight=entry.weight,
                reference_input=entry.reference_input,
                quantized_weights=entry.quantized_weights or "keep",
                layout=entry.layout,
                on_switch=entry.on_switch,
                health=entry.health,
            )
        )
    return tuple(models)


def _inputs(node: Node, entries: tuple[InputEntry, ...], may_fix: bool) -> tuple[ModelInput, ...]:
    _unique(node, entries, "name", "input")
    inputs = []
    for index, entry in enumerate(entries):
        item = node.child(index)
        shape = _shape(item.child("shape"), entry.shape)
        values = _input_values(item.child("values"), entry.values, entry.dtype)
        if isinstance(values, FixedValue) and not may_fix:
            raise item.child("values").error("a fixed value is baked into an ONNX model; a builtin model takes its input at run time")
        inputs.append(ModelInput(name=entry.name, shape=shape, dtype=entry.dtype, values=values))
    if all(i.fixed for i in inputs):
        raise node.error("every input has a fixed value; at least one must be fed at run time")
    return tuple(inputs)


def _shape(node: Node, dims: tuple[Any, ...]) -> tuple[int, ...]:
    elements = 1
    for index, dim in enumerate(dims):
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 < dim <= MAX_ELEMENTS:
            raise node.child(index).error(
                f"input dimensions must be positive integers (fixed shapes), got {dim!r} (at most {MAX_ELEMENTS})")
        elements *= dim
    if elements > MAX_ELEMENTS:
        raise node.error(f"holds {elements} elements, more than the {MAX_ELEMENTS} a tensor may have")
    return dims


def _input_values(node: Node, values: InputValues | None, dtype: str) -> ValueRange | FixedValue | None:
    """`{range: [low, high]}` or `{fixed: value}`: numbers the dtype holds (integers for
    integer dtypes), low <= high."""
    if values is None:
        return None
    if (values.range is None) == (values.fixed is None):
        raise node.error("give exactly one of 'range: [low, high]' or 'fixed: value'")
    if values.range is None:  # so `fixed` is given
        return FixedValue(_input_value(node.child("fixed"), values.fixed, dtype))
    if len(values.range) != 2:
        raise node.child("range").error(f"must be [low, high], got {list(values.range)!r}")
    low, high = (_input_value(node.child("range").child(i), bound, dtype) for i, bound in enumerate(values.range))
    if low > high:
        raise node.child("range").error(f"low must not exceed high, got [{low}, {high}]")
    return ValueRange(low, high)


def _input_value(node: Node, value: Any, dtype: str) -> float | int:
    integer = dtype in INTEGER_LIMITS
    value = Node(value, node.file, node.path).decode(int if integer else float)
    low, high = INTEGER_LIMITS[dtype] if integer else (-FLOAT_LIMITS[dtype], FLOAT_LIMITS[dtype])
    if not low <= value <= high:
        raise node.error(f"{value} does not fit in {dtype} (from {low:g} to {high:g})")
    return value


def _tuning(node: Node, entry: TuningEntry, classes: tuple[DeviceClass, ...]) -> TuningPolicy:
    class_names = [c.name for c in classes]
    overrides = node.child("trials_per_class_override")
    _class_keys(overrides, entry.trials_per_class_override, class_names)
    for name, trials in entry.trials_per_class_override.items():
        if not 0 <= trials <= MAX_TRIALS:
            raise overrides.child(name).error(f"must be between 0 and {MAX_TRIALS}, got {trials}")
    borrow = node.child("borrow")
    _class_keys(borrow, entry.borrow, class_names)
    for name, lender in entry.borrow.items():
        _declared(borrow.child(name), lender, class_names, "device class")
        if lender == name:
            raise borrow.child(name).error("a class cannot borrow tuning from itself")
    _check_borrow_acyclic(borrow, entry.borrow)
    if entry.early_stop is True:
        raise node.child("early_stop").error("must be a mapping with keys window, min_gain, or false to tune every "
                                              "task to its budget, got true")
    _check_trials_per_task(node, entry)
    return TuningPolicy(
        trials_per_class=entry.trials_per_class,
        trials_per_class_override=entry.trials_per_class_override,
        trials_per_iter=entry.trials_per_iter,
        max_trials_per_task=entry.max_trials_per_task,
        time_limit_s=entry.time_limit_s,
        borrow=entry.borrow,
        trials_per_task=entry.trials_per_task,
        early_stop=entry.early_stop or None,
    )


def _check_trials_per_task(node: Node, entry: TuningEntry) -> None:
    """Whole rounds, not below the task cap, and not together with trials_per_class (one
    budget rule per fleet; a class's override still sets that class's total)."""
    trials, per_iter = entry.trials_per_task, entry.trials_per_iter
    if trials is None:
        return
    where = node.child("trials_per_task")
    if entry.trials_per_class is not None:
        raise where.error("give either trials_per_task (trials each task gets) or trials_per_class "
                          "(trials a class deals over its tasks), not both")
    if trials % per_iter:
        lower, upper = max(trials // per_iter, 1) * per_iter, (trials // per_iter + 1) * per_iter
        raise where.error(f"must be a whole number of rounds of tuning.trials_per_iter ({per_iter}): "
                          f"MetaSchedule measures a task a round at a time; use {lower} or {upper}, got {trials}")
    cap = entry.max_trials_per_task
    if cap is not None and cap < trials:
        raise node.child("max_trials_per_task").error(
            f"must be at least tuning.trials_per_task ({trials}): it caps a task, trials moved to it "
            f"included; got {cap}")


def _class_keys(node: Node, mapping: Mapping[str, Any], class_names: list[str]) -> None:
    """The keys of a per-class mapping are declared classes."""
    for key in mapping:
        if key not in class_names:
            hint = difflib.get_close_matches(key, class_names, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise node.child(key).error(f"unknown key{suggestion}; allowed here: {', '.join(class_names)}")


def _check_borrow_acyclic(node: Node, borrow: Mapping[str, str]) -> None:
    """Borrowing may chain (c from b, b from a: tuned in that order) but never loop."""
    for start in borrow:
        chain = [start]
        while chain[-1] in borrow:
            lender = borrow[chain[-1]]
            if lender == start:
                if len(chain) == 2:
                    raise node.child(start).error(f"'{start}' and '{lender}' borrow from each other; only one direction is allowed")
                loop = " -> ".join([*chain, start])
                raise node.child(start).error(f"borrowing goes round in a circle ({loop}); one of these classes must tune without borrowing")
            if lender in chain:
                break  # a loop that does not pass through `start`: reported from one of its members
            chain.append(lender)


def _artifacts(node: Node, entry: ArtifactsEntry) -> ArtifactSettings:
    # `dir` is checked by `build`, which says it is not writable (exit 5)
    check_file(node.child("signing_key"), entry.signing_key)
    check_file(node.child("public_key"), entry.public_key)
    if entry.signing_key.is_relative_to(entry.dir):
        raise node.child("signing_key").error(
            f"the private signing key must live outside the artifacts directory ({entry.dir}), which is published"
        )
    if entry.signing_key == entry.public_key or os.path.realpath(entry.signing_key) == os.path.realpath(entry.public_key):
        raise node.child("public_key").error(
            f"is the same file as signing_key ({entry.signing_key}); the public key needs its own file, "
            f"e.g. {entry.signing_key.with_suffix('.pub')}"
        )
    return ArtifactSettings(dir=entry.dir, signing_key=entry.signing_key, public_key=entry.public_key)


def _deploy(node: Node, entry: DeployEntry | None, workdir: Path, artifacts: ArtifactSettings) -> DeploySettings | None:
    if entry is None:
        return None
    host, _, port = entry.bind.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise node.child("bind").error(f"'{entry.bind}' is not ADDRESS:PORT, e.g. 10.231.7.1:8470")
    problem = address_problem(host)
    if problem:
        raise node.child("bind").error(problem)
    if not re.fullmatch(r"https?://[A-Za-z0-9.:\[\]-]+(:[0-9]{1,5})?/?", entry.url):
        raise node.child("url").error(f"'{entry.url}' is not a server URL boards can reach, e.g. https://10.231.7.1:8470")
    _check_url_scheme(node.child("url"), entry.url, entry.tls)
    if entry.tokens_dir is not None:
        check_directory(node.child("tokens_dir"), entry.tokens_dir)
    if entry.max_connections_per_client > entry.max_connections:
        raise node.child("max_connections_per_client").error(
            f"is {entry.max_connections_per_client}, more than deploy.max_connections ({entry.max_connections}): "
            "one client may hold at most every connection the server holds"
        )
    return DeploySettings(
        bind_host=host,
        port=int(port),
        url=entry.url.rstrip("/"),
        tokens_dir=entry.tokens_dir or Workdir(workdir).tokens,
        keep_releases=entry.keep_releases,
        tls=TlsFiles.beside(artifacts.signing_key) if entry.tls else None,
        decision_ttl_s=entry.decision_ttl_s,
        max_connections=entry.max_connections,
        max_connections_per_client=entry.max_connections_per_client,
        header_timeout_s=entry.header_timeout_s,
        keepalive_timeout_s=entry.keepalive_timeout_s,
        parallel=entry.parallel,
    )


def _check_url_scheme(node: Node, url: str, tls: bool) -> None:
    """HTTPS unless `tls: false` was asked for, and then plain HTTP (the URL says what is spoken)."""
    if tls and not url.startswith("https://"):
        raise node.error(
            f"'{url}' is plain HTTP, but the server speaks HTTPS (deploy.tls is on by default): write "
            f"{url.replace('http://', 'https://', 1)}, or set deploy.tls: false to send tokens in clear"
        )
    if not tls and not url.startswith("http://"):
        raise node.error(f"'{url}' is HTTPS, but deploy.tls is false: write {url.replace('https://', 'http://', 1)}, or drop tls: false")


def _pin(node: Node, pins: Mapping[str, Any]) -> FrozenMap:
    """{model: version} (checked against the declared models once all are loaded)."""
    for model, version in pins.items():
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise node.child(model).error(f"must map a model name to an artifact version (an integer from 1), got {model!r}: {version!r}")
    return FrozenMap(pins)


def _check_classes_have_boards(root: Node, fleet: Fleet) -> None:
    """A class without boards can be neither tuned nor measured: a forgotten board or class."""
    for index, device_class in enumerate(fleet.device_classes):
        if not fleet.boards_of(device_class.name):
            raise root.child("device_classes").child(index).error(
                f"class '{device_class.name}' has no boards, so it can be neither tuned nor measured; add a board "
                f"with device_class: {device_class.name}, or remove the class"
            )


def _tuning_pools(node: Node, entries: tuple[ClassEntry, ...], fleet: Fleet) -> tuple[DeviceClass, ...]:
    """Each class with the names of the boards its `tuning_pool` names or selects, in inventory
    order (None where it has none: every board of the class tunes)."""
    return tuple(
        dataclasses.replace(device_class, tuning_pool=_pool(node.child(index).child("tuning_pool"), entry.tuning_pool,
                                                            device_class.name, fleet.boards))
        if entry.tuning_pool is not None else device_class
        for index, (entry, device_class) in enumerate(zip(entries, fleet.device_classes))
    )  # fmt: skip


def _pool(node: Node, items: tuple[str, ...], device_class: str, boards: tuple[Board, ...]) -> tuple[str, ...]:
    """The boards of `device_class` that any of `items` names (a board name) or matches (a selector)."""
    own = tuple(b for b in boards if b.device_class == device_class)
    chosen: set[str] = set()
    for index, item in enumerate(items):
        where = node.child(index)
        chosen |= _pool_selection(where, item, own) if "=" in item else {_pool_board(where, item, own, boards)}
    return tuple(b.name for b in own if b.name in chosen)


def _pool_board(node: Node, name: str, own: tuple[Board, ...], boards: tuple[Board, ...]) -> str:
    """`name`, a board of the class."""
    if any(b.name == name for b in own):
        return name
    other = next((b for b in boards if b.name == name), None)
    if other is not None:
        raise node.error(f"'{name}' is a board of class '{other.device_class}', not of '{own[0].device_class}'; "
                         f"allowed: {_pool_allowed(own)}")
    hint = difflib.get_close_matches(name, [b.name for b in own], n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    raise node.error(f"'{name}' is not a board of the fleet{suggestion}; allowed: {_pool_allowed(own)}")


def _pool_selection(node: Node, text: str, own: tuple[Board, ...]) -> set[str]:
    """The boards of the class that the selector `text` matches: at least one."""
    try:
        selector = parse_selector(text, option="selector")
    except InventoryError as err:
        raise node.error(str(err)) from None
    matched = {b.name for b in own if selector.matches(b)}
    if not matched:
        have = "; ".join(f"{key}: {', '.join(sorted({v for b in own if (v := board_value(b, key)) is not None})) or 'none'}"
                         for key, _ in selector.pairs)  # fmt: skip
        raise node.error(f"selector '{text}' matches no board of class '{own[0].device_class}' (its boards have {have}); "
                         f"allowed: {_pool_allowed(own)}")
    return matched


def _pool_allowed(own: tuple[Board, ...]) -> str:
    names = ", ".join(b.name for b in own[:POOL_NAMES_SHOWN]) + (" ..." if len(own) > POOL_NAMES_SHOWN else "")
    return f"the class's boards ({names}), or selectors key=value[,key=value...] over their labels"


def _check_pins(root: Node, fleet: Fleet) -> None:
    models = [m.name for m in fleet.models]
    pinned = [(root.child("device_classes").child(i), c.pin) for i, c in enumerate(fleet.device_classes)]
    pinned += [(root.child("boards").child(i), b.pin) for i, b in enumerate(fleet.boards)]
    for where, pin in pinned:
        for model in pin:
            _declared(where.child("pin").child(model), model, models, "model")
