"""Load and validate fleet.yaml and the device profiles it names into `schema` records.

Validation happens once, here; an invalid inventory raises `InventoryError` naming the file,
the YAML path and what is allowed. Every value's type is checked before it is used, every
count and duration is capped, and the files and folders the inventory names (profiles, ONNX
models, SSH keys, known_hosts, ssh config files, work and artifact folders) must be of the
right kind. Nothing outside the inventory files is changed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import Any

from edgetune.errors import InventoryError
from edgetune.inventory.reader import Node, check_unique, check_version, display_path, read_yaml
from edgetune.inventory.schema import (
    BUILTIN_MODELS,
    DTYPES,
    LAYOUTS,
    QUANTIZED_WEIGHTS,
    FixedValue,
    FrozenMap,
    HOST_KEY_POLICIES,
    NO_SSH_CONFIG,
    SCHEMA_VERSION,
    ArtifactSettings,
    Board,
    CompareSettings,
    DeviceClass,
    DeploySettings,
    DeviceProfile,
    EarlyStop,
    RegressSettings,
    Fleet,
    Measurement,
    Model,
    ModelInput,
    SimSettings,
    Simulation,
    SshSettings,
    TlsFiles,
    Tracker,
    TuningPolicy,
    ValueRange,
)
from edgetune.inventory.reference_input import check_reference_input
from edgetune.inventory.workdir import Workdir

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_PRIVATE_KEY_PEM = re.compile(rb"-----BEGIN (OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----")
_SECRET_KEYS = ("password", "passphrase", "secret")

FLEET_KEYS = ("version", "name", "workdir", "sim", "trackers", "ssh", "device_classes", "boards", "models", "tuning", "artifacts", "deploy", "regress")
BOARD_KEYS = ("name", "address", "device_class", "tracker", "python", "workdir", "ssh", "threads", "simulated", "pin", "token_env")
DEPLOY_KEYS = ("bind", "url", "tokens_dir", "keep_releases", "tls", "decision_ttl_s")
MAX_DECISION_TTL_S = 30 * 86400
MAX_KEEP_RELEASES = 100
SSH_KEYS = ("user", "port", "key", "known_hosts", "config", "host_key_policy", "passphrase_env", "connect_timeout_s", "command_timeout_s")
PROFILE_KEYS = ("version", "name", "description", "target", "cross_compiler", "runtime", "measurement", "firmware_command", "hardware")
MODEL_KEYS = ("name", "builtin", "onnx", "inputs", "weight", "reference_input", "quantized_weights", "layout")
INTEGER_LIMITS = {"int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
FLOAT_LIMITS = {"float16": 65504.0, "float32": 3.4028234663852886e38}
MEASUREMENT_KEYS = ("number", "repeat", "min_repeat_ms", "cooldown_ms", "compare", "enable_cpu_cache_flush")
COMPARE_KEYS = ("rounds", "repeat", "min_repeat_ms")
TUNING_KEYS = ("trials_per_task", "trials_per_class", "trials_per_class_override", "trials_per_iter", "max_trials_per_task", "early_stop", "time_limit_s", "borrow")

# Caps on counts and durations: far above any real fleet, far below what overflows or hangs.
MAX_TRACKERS = 64
MAX_CLASSES = 256
MAX_BOARDS = 10_000
MAX_MODELS = 256
MAX_INPUTS = 64
MAX_RANK = 8
MAX_ELEMENTS = 2**31 - 1  # per input tensor, and per dimension
MAX_THREADS = 1024
MAX_CPU_QUOTA = 64.0  # cores
SIM_ARCHES = ("x86_64", "aarch64")
MAX_TRIALS = 1_000_000
MAX_TRIALS_PER_ITER = 10_000
MAX_WEIGHT = 1e6
MAX_TIME_LIMIT_S = 30 * 86_400.0
MAX_EARLY_STOP_GAIN = 0.99  # a task improving by less than this over the window stops
MAX_CONNECT_TIMEOUT_S = 3_600.0
MAX_COMMAND_TIMEOUT_S = 86_400.0
MAX_MEASURE_NUMBER = 10_000
MAX_MEASURE_REPEAT = 1_000
MAX_COMPARE_ROUNDS = 100
MAX_MS = 60_000
MAX_HARDWARE_VALUES = 256
MAX_HARDWARE_DEPTH = 8
MAX_KEY_FILE_BYTES = 64 << 10
MAX_PATH_CHARS = 4000  # PATH_MAX is 4096 bytes
_TARGET_STRINGS = ("kind", "mcpu", "mtriple", "mabi", "mfloat-abi", "model")
_TARGET_COUNTS = {"num-cores": (1, MAX_THREADS), "opt-level": (0, 3)}
_TARGET_INT_LIMIT = 2**31 - 1


def load_fleet(path: str | Path) -> Fleet:
    """Read fleet.yaml and every profile it names; raise InventoryError on the first problem."""
    path = Path(os.path.abspath(path))
    root = Node(read_yaml(path), path)
    check_version(root, SCHEMA_VERSION)
    root.mapping(FLEET_KEYS)
    base = path.parent
    workdir = _directory(root.child("workdir", ".edgetune"), base)
    sim = _sim_settings(root.child("sim", None), base)
    trackers = _trackers(root.child("trackers"))
    ssh = _ssh(root.child("ssh", {}), base, SshSettings())
    classes = _device_classes(root.child("device_classes"), base)
    boards = _with_home_ssh_config(root, _boards(root.child("boards"), base, ssh, classes, trackers, sim))
    models = _models(root.child("models"), base)
    artifacts = _artifacts(root.child("artifacts"), base)
    fleet = Fleet(
        path=path,
        name=_name(root, "name"),
        workdir=workdir,
        trackers=trackers,
        device_classes=classes,
        boards=boards,
        models=models,
        tuning=_tuning(root.child("tuning"), classes),
        artifacts=artifacts,
        sim=sim,
        deploy=_deploy(root.child("deploy", None), base, workdir, artifacts),
        regress=_regress(root.child("regress", {})),
    )
    _check_classes_have_boards(root, fleet)
    _check_ssh_files(root, fleet)
    _check_pins(root, fleet)
    return fleet


def load_profile(path: Path) -> DeviceProfile:
    root = Node(read_yaml(path), path)
    check_version(root, SCHEMA_VERSION)
    root.mapping(PROFILE_KEYS)
    runtime = root.child("runtime").mapping(("threads",))
    compiler = root.get("cross_compiler", str)
    return DeviceProfile(
        name=_name(root, "name"),
        path=path,
        description=root.get("description", str, ""),
        target=_target(root.child("target")),
        cross_compiler=None if compiler == "host" else compiler,
        runtime_threads=runtime.positive("threads", int, MAX_THREADS),
        measurement=_measurement(root.child("measurement", {})),
        firmware_command=root.get("firmware_command", str),
        hardware=_hardware(root.child("hardware", {})),
    )


# -- fleet sections ---------------------------------------------------------------------------
def _sim_settings(node: Node, base: Path) -> SimSettings | None:
    if node.value is None:
        return None
    node.mapping(("bridge", "host_address", "cache"))
    bridge = node.get("bridge", str)
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,15}", bridge):
        raise node.child("bridge").error(f"'{bridge}' is not a valid interface name (1-15 letters, digits, '-' or '_')")
    host_address = node.get("host_address", str)
    try:
        interface = ipaddress.IPv4Interface(host_address)
    except ValueError:
        raise node.child("host_address").error(f"'{host_address}' is not an IPv4 address with prefix, e.g. 10.231.7.1/24") from None
    if interface.network.prefixlen == 32:
        raise node.child("host_address").error("needs a prefix length that leaves room for boards, e.g. /24")
    cache = _path(node.child("cache"), base) if node.has("cache") else SimSettings.cache
    return SimSettings(bridge=bridge, host_address=host_address, cache=cache)


def _trackers(node: Node) -> tuple[Tracker, ...]:
    items = list(node.items(MAX_TRACKERS))
    if not items:
        raise node.error("at least one tracker is required")
    check_unique(items, "name", "tracker")
    trackers = []
    for item in items:
        item.mapping(("name", "bind_host", "public_address", "port", "port_end"))
        port = _port(item, "port")
        port_end = _port(item, "port_end", default=min(port + 9, 65535))
        if port_end < port:
            raise item.child("port_end").error(f"must be at least port ({port}), got {port_end}")
        trackers.append(
            Tracker(
                name=_name(item, "name"),
                bind_host=_address(item, "bind_host"),
                public_address=_address(item, "public_address"),
                port=port,
                port_end=port_end,
            )
        )
    return tuple(trackers)


def _ssh(node: Node, base: Path, defaults: SshSettings) -> SshSettings:
    if isinstance(node.value, dict):
        for key in node.value:
            if any(secret in str(key).lower() for secret in _SECRET_KEYS) and key != "passphrase_env":
                raise InventoryError(
                    f"{display_path(node.file)}: {node._child_path(str(key))}: secrets are never read from YAML; "
                    "use key-based auth, and name an environment variable holding the key's passphrase in passphrase_env"
                )
    node.mapping(SSH_KEYS)
    key = node.child("key", None)
    known_hosts = node.child("known_hosts", None)
    config = node.child("config", None)
    passphrase_env = _env_name(node, "passphrase_env", defaults.passphrase_env)
    return SshSettings(
        user=node.get("user", str, defaults.user),
        port=_port(node, "port", default=defaults.port),
        key=_path(key, base) if key.value is not None else defaults.key,
        known_hosts=_file(known_hosts, base) if known_hosts.value is not None else defaults.known_hosts,
        config=_ssh_config(config, base) if config.value is not None else defaults.config,
        host_key_policy=node.choice("host_key_policy", HOST_KEY_POLICIES, defaults.host_key_policy),
        passphrase_env=passphrase_env,
        connect_timeout_s=node.positive("connect_timeout_s", float, MAX_CONNECT_TIMEOUT_S, defaults.connect_timeout_s),
        command_timeout_s=node.positive("command_timeout_s", float, MAX_COMMAND_TIMEOUT_S, defaults.command_timeout_s),
    )


def _ssh_config(node: Node, base: Path) -> Path | None:
    """An OpenSSH client config file that exists, or `none` for no file at all."""
    if node.scalar(str) == NO_SSH_CONFIG:
        return None
    path = _path(node, base)
    found = _stat(node, path)
    if found is None or not stat.S_ISREG(found.st_mode):
        what = "does not exist" if found is None else "is not a file"
        raise node.error(f"ssh config file '{node.value}' {what} (looked for {path}); name an OpenSSH client "
                         f"config file, or '{NO_SSH_CONFIG}' for none")
    return path


def _with_home_ssh_config(root: Node, boards: tuple[Board, ...]) -> tuple[Board, ...]:
    """A board for which no ssh config file is named reads ~/.ssh/config, if there is one, as
    ssh would; a simulated board none: it is reached directly on the bridge made for it."""
    home = Path.home() / ".ssh" / "config"
    if not home.is_file():
        return boards
    return tuple(
        board if board.simulated is not None or _ssh_location(root, index, "config").value is not None
        else dataclasses.replace(board, ssh=dataclasses.replace(board.ssh, config=home))
        for index, board in enumerate(boards)
    )


def _device_classes(node: Node, base: Path) -> tuple[DeviceClass, ...]:
    items = list(node.items(MAX_CLASSES))
    if not items:
        raise node.error("at least one device class is required")
    check_unique(items, "name", "device class")
    classes = []
    for item in items:
        item.mapping(("name", "profile", "pin"))
        name = _name(item, "name")
        profile_node = item.child("profile")
        profile_path = _path(profile_node, base)
        found = _stat(profile_node, profile_path)
        if found is None or not stat.S_ISREG(found.st_mode):
            what = "does not exist" if found is None else "is not a file"
            raise profile_node.error(f"profile file '{profile_node.value}' {what} (looked for {profile_path})")
        classes.append(DeviceClass(name=name, profile=load_profile(profile_path), pin=_pin(item.child("pin", {}))))
    return tuple(classes)


def _boards(
    node: Node,
    base: Path,
    ssh: SshSettings,
    classes: tuple[DeviceClass, ...],
    trackers: tuple[Tracker, ...],
    sim: SimSettings | None,
) -> tuple[Board, ...]:
    items = list(node.items(MAX_BOARDS))
    if not items:
        raise node.error("at least one board is required")
    check_unique(items, "name", "board")
    check_unique(items, "address", "board address")
    class_names = [c.name for c in classes]
    tracker_names = [t.name for t in trackers]
    boards = []
    for item in items:
        item.mapping(BOARD_KEYS)
        device_class = item.get("device_class", str)
        if device_class not in class_names:
            raise item.child("device_class").error(
                f"'{device_class}' is not a declared device class (declared: {', '.join(class_names)})"
            )
        simulated = _simulation(item.child("simulated", None), sim)
        _check_board_arch(item, simulated, next(c for c in classes if c.name == device_class))
        board = Board(
            name=_name(item, "name"),
            address=_board_address(item, simulated, sim),
            device_class=device_class,
            tracker=_board_tracker(item, tracker_names),
            python=_board_path(item, "python", base, simulated),
            workdir=_board_workdir(item, base, simulated),
            ssh=_ssh(item.child("ssh", {}), base, ssh),
            threads=item.positive("threads", int, MAX_THREADS, None),
            simulated=simulated,
            pin=_pin(item.child("pin", {})),
            token_env=_env_name(item, "token_env"),
        )
        boards.append(board)
    _check_own_token_variables(items, boards)
    return tuple(boards)


def _check_own_token_variables(items: list[Node], boards: list[Board]) -> None:
    """No two boards read their download token from the same variable: they would share one."""
    first_reader: dict[str, str] = {}
    for item, board in zip(items, boards):
        if board.token_env is None:
            continue
        if board.token_env in first_reader:
            raise item.child("token_env").error(
                f"${board.token_env} is also the token variable of board {first_reader[board.token_env]}: boards "
                f"{first_reader[board.token_env]} and {board.name} would share one download token; give each its own"
            )
        first_reader[board.token_env] = board.name


def _check_board_arch(item: Node, simulated: Simulation | None, device_class: DeviceClass) -> None:
    """An emulated board runs what its class's target compiles for, and nothing else."""
    if simulated is None or not simulated.emulated:
        return
    triple = str(device_class.profile.target.get("mtriple", ""))
    if not triple.startswith(simulated.arch):
        raise item.child("simulated").child("arch").error(
            f"an {simulated.arch} board needs a device class whose profile targets {simulated.arch}; class "
            f"'{device_class.name}' ({device_class.profile.path}) targets '{triple or 'the host'}'"
        )


def _board_tracker(item: Node, tracker_names: list[str]) -> str:
    if not item.has("tracker"):
        if len(tracker_names) == 1:
            return tracker_names[0]
        raise item.child("tracker", None).error(
            f"required when the fleet has several trackers (declared: {', '.join(tracker_names)})"
        )
    tracker = item.get("tracker", str)
    if tracker not in tracker_names:
        raise item.child("tracker").error(f"'{tracker}' is not a declared tracker (declared: {', '.join(tracker_names)})")
    return tracker


def _simulation(node: Node, sim: SimSettings | None) -> Simulation | None:
    if node.value is None:
        return None
    node.mapping(("cpu_quota", "arch"))
    if sim is None:
        raise node.error("a simulated board needs the top-level 'sim' section (bridge, host_address)")
    return Simulation(cpu_quota=node.positive("cpu_quota", float, MAX_CPU_QUOTA, 1.0),
                      arch=node.choice("arch", SIM_ARCHES, "x86_64"))


def _board_address(item: Node, simulated: Simulation | None, sim: SimSettings | None) -> str:
    address = _address(item, "address")
    if simulated is None:
        return address
    network = ipaddress.IPv4Interface(sim.host_address).network
    try:
        ip = ipaddress.IPv4Address(address)
    except ValueError:
        raise item.child("address").error(f"a simulated board needs an IPv4 address in {network}, got '{address}'") from None
    host = ipaddress.IPv4Interface(sim.host_address).ip
    if ip not in network or ip in (host, network.network_address, network.broadcast_address):
        raise item.child("address").error(f"'{address}' is not a free board address in the simulated network {network}")
    return address


def _board_path(item: Node, key: str, base: Path, simulated: Simulation | None) -> str:
    """Paths on the board. Simulated x86 boards share this machine's files, so relative paths
    are resolved against fleet.yaml's folder; real and emulated boards (which have a root file
    system of their own) need absolute paths."""
    if simulated is not None and not simulated.emulated:
        return str(_path(item.child(key), base))
    value = item.get(key, str)
    if not value.startswith("/"):
        raise item.child(key).error(f"must be an absolute path on the board, got '{value}'")
    return value


def _board_workdir(item: Node, base: Path, simulated: Simulation | None) -> str:
    """A simulated board's workdir is on this machine, so it must be a folder or makeable."""
    workdir = _board_path(item, "workdir", base, simulated)
    if simulated is not None and not simulated.emulated:
        _check_directory(item.child("workdir"), Path(workdir))
    return workdir


def _models(node: Node, base: Path) -> tuple[Model, ...]:
    items = list(node.items(MAX_MODELS))
    if not items:
        raise node.error("at least one model is required")
    check_unique(items, "name", "model")
    models = []
    for item in items:
        item.mapping(MODEL_KEYS)
        if item.has("builtin") == item.has("onnx"):
            raise item.error("give exactly one of 'builtin' (a reference model name) or 'onnx' (a file path)")
        name = _name(item, "name")
        builtin = item.choice("builtin", BUILTIN_MODELS, None)
        onnx_path = _onnx_path(item.child("onnx"), base) if item.has("onnx") else None
        inputs = _inputs(item.child("inputs"), builtin is None)
        reference = item.child("reference_input", None)
        if builtin is not None and item.has("quantized_weights"):
            raise item.child("quantized_weights").error("applies to ONNX models only (a builtin model has float32 weights)")
        quantized_weights = item.choice("quantized_weights", QUANTIZED_WEIGHTS, "keep")
        layout = item.choice("layout", LAYOUTS, "NCHW")
        if quantized_weights == "integer" and layout != "NHWC":
            raise item.child("quantized_weights").error(
                f"'integer' computes convolutions in the NHWC micro-kernel; add 'layout: NHWC' (layout is {layout})")
        models.append(
            Model(
                name=name,
                inputs=inputs,
                onnx=onnx_path,
                builtin=builtin,
                weight=item.positive("weight", float, MAX_WEIGHT, 1.0),
                reference_input=_reference_input(reference, base, inputs) if reference.value is not None else None,
                quantized_weights=quantized_weights,
                layout=layout,
            )
        )
    return tuple(models)


def _inputs(node: Node, may_fix: bool) -> tuple[ModelInput, ...]:
    items = list(node.items(MAX_INPUTS))
    if not items:
        raise node.error("at least one input is required")
    check_unique(items, "name", "input")
    inputs = []
    for item in items:
        item.mapping(("name", "shape", "dtype", "values"))
        name = item.get("name", str)
        shape = []
        for dim in item.child("shape").items(MAX_RANK):
            if isinstance(dim.value, bool) or not isinstance(dim.value, int) or not 0 < dim.value <= MAX_ELEMENTS:
                raise dim.error(f"input dimensions must be positive integers (fixed shapes), got {dim.value!r} (at most {MAX_ELEMENTS})")
            shape.append(dim.value)
        elements = 1
        for dim in shape:
            elements *= dim
        if elements > MAX_ELEMENTS:
            raise item.child("shape").error(f"holds {elements} elements, more than the {MAX_ELEMENTS} a tensor may have")
        dtype = item.choice("dtype", DTYPES, "float32")
        values = _input_values(item.child("values", None), dtype)
        if isinstance(values, FixedValue) and not may_fix:
            raise item.child("values").error("a fixed value is baked into an ONNX model; a builtin model takes its input at run time")
        inputs.append(ModelInput(name=name, shape=tuple(shape), dtype=dtype, values=values))
    if all(i.fixed for i in inputs):
        raise node.error("every input has a fixed value; at least one must be fed at run time")
    return tuple(inputs)


def _input_values(node: Node, dtype: str) -> ValueRange | FixedValue | None:
    """`{range: [low, high]}` or `{fixed: value}`: numbers the dtype holds (integers for
    integer dtypes), low <= high."""
    if node.value is None:
        return None
    node.mapping(("range", "fixed"))
    if node.has("range") == node.has("fixed"):
        raise node.error("give exactly one of 'range: [low, high]' or 'fixed: value'")
    if node.has("fixed"):
        return FixedValue(_input_value(node.child("fixed"), dtype))
    bounds = list(node.child("range").items(2))
    if len(bounds) != 2:
        raise node.child("range").error(f"must be [low, high], got {node.value['range']!r}")
    low, high = (_input_value(bound, dtype) for bound in bounds)
    if low > high:
        raise node.child("range").error(f"low must not exceed high, got [{low}, {high}]")
    return ValueRange(low, high)


def _input_value(node: Node, dtype: str) -> float | int:
    integer = dtype in INTEGER_LIMITS
    value = node.scalar(int if integer else float)
    low, high = INTEGER_LIMITS[dtype] if integer else (-FLOAT_LIMITS[dtype], FLOAT_LIMITS[dtype])
    if not low <= value <= high:
        raise node.error(f"{value} does not fit in {dtype} (from {low:g} to {high:g})")
    return value


def _onnx_path(node: Node, base: Path) -> Path:
    return _existing_file(node, base, "ONNX file")  # its graph is read and checked by `edgetune check` (tune.models.onnx_inputs)


def _reference_input(node: Node, base: Path, inputs: tuple[ModelInput, ...]) -> Path:
    path = _existing_file(node, base, "reference input file")
    check_reference_input(node, path, inputs)
    return path


def _existing_file(node: Node, base: Path, kind: str) -> Path:
    path = _path(node, base)
    found = _stat(node, path)
    if found is None or not stat.S_ISREG(found.st_mode):
        what = "does not exist" if found is None else "is not a file"
        raise node.error(f"{kind} '{node.value}' {what} (looked for {path})")
    return path


def _tuning(node: Node, classes: tuple[DeviceClass, ...]) -> TuningPolicy:
    node.mapping(TUNING_KEYS)
    class_names = [c.name for c in classes]
    overrides = _class_mapping(node.child("trials_per_class_override", {}), class_names, int)
    for name, trials in overrides.items():
        if not 0 <= trials <= MAX_TRIALS:
            raise node.child("trials_per_class_override").child(name).error(f"must be between 0 and {MAX_TRIALS}, got {trials}")
    borrow = _class_mapping(node.child("borrow", {}), class_names, str)
    for name, lender in borrow.items():
        where = node.child("borrow").child(name)
        if lender not in class_names:
            raise where.error(f"'{lender}' is not a declared device class (declared: {', '.join(class_names)})")
        if lender == name:
            raise where.error("a class cannot borrow tuning from itself")
    _check_borrow_acyclic(node.child("borrow", {}), borrow)
    per_iter = node.positive("trials_per_iter", int, MAX_TRIALS_PER_ITER, 16)
    return TuningPolicy(
        trials_per_class=node.non_negative("trials_per_class", int, MAX_TRIALS, None),
        trials_per_class_override=FrozenMap(overrides),
        trials_per_iter=per_iter,
        max_trials_per_task=node.positive("max_trials_per_task", int, MAX_TRIALS, None),
        time_limit_s=node.positive("time_limit_s", float, MAX_TIME_LIMIT_S, None),
        borrow=FrozenMap(borrow),
        trials_per_task=_trials_per_task(node, per_iter),
        early_stop=_early_stop(node.child("early_stop", {})),
    )


def _trials_per_task(node: Node, per_iter: int) -> int | None:
    """Whole rounds, not below the task cap, and not together with trials_per_class (one
    budget rule per fleet; a class's override still sets that class's total)."""
    trials = node.positive("trials_per_task", int, MAX_TRIALS, None)
    if trials is None:
        return None
    where = node.child("trials_per_task")
    if node.has("trials_per_class"):
        raise where.error("give either trials_per_task (trials each task gets) or trials_per_class "
                          "(trials a class deals over its tasks), not both")
    if trials % per_iter:
        lower, upper = max(trials // per_iter, 1) * per_iter, (trials // per_iter + 1) * per_iter
        raise where.error(f"must be a whole number of rounds of tuning.trials_per_iter ({per_iter}): "
                          f"MetaSchedule measures a task a round at a time; use {lower} or {upper}, got {trials}")
    cap = node.get("max_trials_per_task", int, None)
    if cap is not None and cap < trials:
        raise node.child("max_trials_per_task").error(
            f"must be at least tuning.trials_per_task ({trials}): it caps a task, trials moved to it "
            f"included; got {cap}")
    return trials


def _early_stop(node: Node) -> EarlyStop | None:
    """`early_stop: {window, min_gain}`, or `early_stop: false` to tune every task to its budget."""
    if node.value is False:
        return None
    node.mapping(("window", "min_gain"))
    default = EarlyStop()
    return EarlyStop(
        window=node.positive("window", int, MAX_TRIALS, default.window),
        min_gain=node.bounded("min_gain", float, 0.0, MAX_EARLY_STOP_GAIN, default.min_gain),
    )


def _check_borrow_acyclic(node: Node, borrow: dict[str, str]) -> None:
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


def _class_mapping(node: Node, class_names: list[str], kind: type) -> dict[str, Any]:
    node.mapping(tuple(class_names))
    return {key: node.child(key).scalar(kind) for key in node.value}


def _artifacts(node: Node, base: Path) -> ArtifactSettings:
    node.mapping(("dir", "signing_key", "public_key"))
    directory = _path(node.child("dir"), base)  # checked by `build`, which says it is not writable (exit 5)
    signing_key = _file(node.child("signing_key"), base)
    public_key = _file(node.child("public_key"), base)
    if signing_key.is_relative_to(directory):
        raise node.child("signing_key").error(
            f"the private signing key must live outside the artifacts directory ({directory}), which is published"
        )
    if signing_key == public_key or os.path.realpath(signing_key) == os.path.realpath(public_key):
        raise node.child("public_key").error(
            f"is the same file as signing_key ({signing_key}); the public key needs its own file, e.g. {signing_key.with_suffix('.pub')}"
        )
    return ArtifactSettings(dir=directory, signing_key=signing_key, public_key=public_key)


def _deploy(node: Node, base: Path, workdir: Path, artifacts: ArtifactSettings) -> DeploySettings | None:
    if node.value is None:
        return None
    node.mapping(DEPLOY_KEYS)
    bind = node.get("bind", str)
    host, _, port = bind.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise node.child("bind").error(f"'{bind}' is not ADDRESS:PORT, e.g. 10.231.7.1:8470")
    _address(Node({"bind": host}, node.file, node.path), "bind")
    url = node.get("url", str)
    if not re.fullmatch(r"https?://[A-Za-z0-9.:\[\]-]+(:[0-9]{1,5})?/?", url):
        raise node.child("url").error(f"'{url}' is not a server URL boards can reach, e.g. https://10.231.7.1:8470")
    tls = node.get("tls", bool, True)
    _check_url_scheme(node, url, tls)
    tokens_dir = node.child("tokens_dir", None)
    keep = node.positive("keep_releases", int, MAX_KEEP_RELEASES, 3)
    if keep < 2:
        raise node.child("keep_releases").error(f"must be between 2 (the current and the previous release) and {MAX_KEEP_RELEASES}, got {keep}")
    return DeploySettings(
        bind_host=host,
        port=int(port),
        url=url.rstrip("/"),
        tokens_dir=_directory(tokens_dir, base) if tokens_dir.value is not None else Workdir(workdir).tokens,
        keep_releases=keep,
        tls=TlsFiles.beside(artifacts.signing_key) if tls else None,
        decision_ttl_s=node.positive("decision_ttl_s", int, MAX_DECISION_TTL_S, DeploySettings.decision_ttl_s),
    )


def _check_url_scheme(node: Node, url: str, tls: bool) -> None:
    """HTTPS unless `tls: false` was asked for, and then plain HTTP (the URL says what is spoken)."""
    if tls and not url.startswith("https://"):
        raise node.child("url").error(
            f"'{url}' is plain HTTP, but the server speaks HTTPS (deploy.tls is on by default): write "
            f"{url.replace('http://', 'https://', 1)}, or set deploy.tls: false to send tokens in clear"
        )
    if not tls and not url.startswith("http://"):
        raise node.child("url").error(
            f"'{url}' is HTTPS, but deploy.tls is false: write {url.replace('https://', 'http://', 1)}, or drop tls: false"
        )


def _regress(node: Node) -> RegressSettings:
    node.mapping(("threshold", "confidence"))
    defaults = RegressSettings()
    threshold = node.get("threshold", float, defaults.threshold)
    if not 1.0 <= threshold <= 100.0:
        raise node.child("threshold").error(f"is the time ratio that counts as slower, between 1.0 and 100 (e.g. 1.25), got {threshold}")
    confidence = node.get("confidence", float, defaults.confidence)
    if not 0.5 <= confidence <= 0.999:
        raise node.child("confidence").error(f"must be between 0.5 and 0.999 (e.g. 0.95), got {confidence}")
    return RegressSettings(threshold=threshold, confidence=confidence)


def _pin(node: Node) -> FrozenMap:
    """{model: version} (checked against the declared models once all are loaded)."""
    if not isinstance(node.value, dict):
        raise node.error("must be a mapping of model name to artifact version, e.g. {mlp: 3}")
    pins = {}
    for model in node.value:
        version = node.child(str(model)) if isinstance(model, str) else None
        if version is None or isinstance(version.value, bool) or not isinstance(version.value, int) or version.value < 1:
            where = version or node
            raise where.error(f"must map a model name to an artifact version (an integer from 1), got {model!r}: {node.value[model]!r}")
        pins[model] = version.value
    return FrozenMap(pins)


def _check_classes_have_boards(root: Node, fleet: Fleet) -> None:
    """A class without boards can be neither tuned nor measured: a forgotten board or class."""
    for index, device_class in enumerate(fleet.device_classes):
        if not fleet.boards_of(device_class.name):
            raise InventoryError(
                f"{display_path(root.file)}: device_classes[{index}]: class '{device_class.name}' has no boards, so it "
                f"can be neither tuned nor measured; add a board with device_class: {device_class.name}, or remove the class"
            )


def _check_pins(root: Node, fleet: Fleet) -> None:
    models = [m.name for m in fleet.models]
    pinned = [(f"device_classes[{i}]", c.pin) for i, c in enumerate(fleet.device_classes)]
    pinned += [(f"boards[{i}]", b.pin) for i, b in enumerate(fleet.boards)]
    for where, pin in pinned:
        for model in pin:
            if model not in models:
                raise InventoryError(
                    f"{display_path(root.file)}: {where}.pin.{model}: '{model}' is not a declared model (declared: {', '.join(models)})"
                )


def _env_name(node: Node, key: str, default: str | None = None) -> str | None:
    name = node.get(key, str, default)
    if name is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise node.child(key).error(f"'{name}' is not an environment variable name")
    return name


# -- profile sections -------------------------------------------------------------------------
def _target(node: Node) -> FrozenMap:
    """The TVM target dict. The options edgetune reads are typed here (an empty `mcpu` would
    skip the CPU check); TVM itself checks the rest when `check` builds the target."""
    if not isinstance(node.value, dict):
        raise node.error("must be a TVM target as a mapping, e.g. {kind: llvm, mcpu: cortex-a72, num-cores: 4}")
    if "kind" not in node.value:
        raise node.child("kind").error("required field is missing (e.g. llvm)")
    target = {}
    for key, value in node.value.items():
        option = node.child(key, None)
        if key in _TARGET_STRINGS:
            value = option.scalar(str)
        elif key in _TARGET_COUNTS:
            low, high = _TARGET_COUNTS[key]
            value = node.bounded(key, int, low, high)
        elif isinstance(value, list):
            if not all(isinstance(v, str) and v.strip() for v in value):
                raise option.error("a list option must hold strings (not empty), e.g. ['+neon']")
            value = tuple(value)
        elif isinstance(value, str):
            value = option.scalar(str)
        elif not isinstance(value, (int, bool)):
            raise option.error(f"must be a string, integer, boolean or list of strings, got {value!r}")
        elif abs(value) > _TARGET_INT_LIMIT:
            raise option.error(f"must be between -{_TARGET_INT_LIMIT} and {_TARGET_INT_LIMIT}, got {value}")
        target[key] = value
    return FrozenMap(target)


def _hardware(node: Node) -> FrozenMap:
    """Free-form facts (cores, caches, memory ...): plain JSON values, few and shallow, since
    they are part of the profile's digest in every manifest."""
    if not isinstance(node.value, dict):
        raise node.error("must be a mapping of free-form facts (cores, caches, memory ...)")
    pending, count = [(node, 1)], 0
    while pending:
        item, depth = pending.pop()
        count += 1
        if count > MAX_HARDWARE_VALUES:
            raise node.error(f"holds more than {MAX_HARDWARE_VALUES} values; keep it to a few facts about the board")
        if depth > MAX_HARDWARE_DEPTH:
            raise item.error(f"is nested more than {MAX_HARDWARE_DEPTH} levels deep")
        if isinstance(item.value, dict):
            pending.extend((item.child(key, None), depth + 1) for key in item.value)
        elif isinstance(item.value, list):
            pending.extend((element, depth + 1) for element in item.items(MAX_HARDWARE_VALUES))
        elif item.value is not None and not isinstance(item.value, (str, int, float, bool)):
            raise item.error(f"must be a string, number, boolean, list or mapping, got {type(item.value).__name__}")
    return FrozenMap(dict(node.value))


def _measurement(node: Node) -> Measurement:
    node.mapping(MEASUREMENT_KEYS)
    defaults = Measurement()
    if node.get("enable_cpu_cache_flush", bool, False):
        # TVM 0.27's flush (f_preproc cache_flush_cpu_non_first_arg) skips the first argument,
        # which for the VM's invoke_stateful is the function name: it never flushed anything.
        raise node.child("enable_cpu_cache_flush").error(
            "is no longer supported: TVM's flush touches only call arguments, once per repeat, so it "
            "flushed nothing for a whole model and one call in `number` when tuning; remove the line"
        )
    return Measurement(
        number=node.positive("number", int, MAX_MEASURE_NUMBER, defaults.number),
        repeat=node.positive("repeat", int, MAX_MEASURE_REPEAT, defaults.repeat),
        min_repeat_ms=node.non_negative("min_repeat_ms", int, MAX_MS, defaults.min_repeat_ms),
        cooldown_ms=node.non_negative("cooldown_ms", int, MAX_MS, defaults.cooldown_ms),
        compare=_compare_settings(node.child("compare", {}), defaults.compare),
    )


def _compare_settings(node: Node, defaults: CompareSettings) -> CompareSettings:
    node.mapping(COMPARE_KEYS)
    return CompareSettings(
        rounds=node.positive("rounds", int, MAX_COMPARE_ROUNDS, defaults.rounds),
        repeat=node.positive("repeat", int, MAX_MEASURE_REPEAT, defaults.repeat),
        min_repeat_ms=node.positive("min_repeat_ms", int, MAX_MS, defaults.min_repeat_ms),
    )


# -- small fields -----------------------------------------------------------------------------
def _name(node: Node, key: str) -> str:
    value = node.get(key, str)
    if not _NAME.match(value) or len(value) > 128:
        raise node.child(key).error(
            f"'{value[:130]}' is not a valid name (up to 128 letters, digits, '.', '_' and '-', starting with a letter or digit)"
        )
    return value


def _port(node: Node, key: str, default: Any = ...) -> int | None:
    value = node.get(key, int) if default is ... else node.get(key, int, default)
    if value is not None and not 1 <= value <= 65535:
        raise node.child(key).error(f"must be a TCP port between 1 and 65535, got {value}")
    return value


def _address(node: Node, key: str) -> str:
    """An IP address, or a host name. Names whose last label is a number are refused: they
    are mistyped IPv4 addresses (`999.1.1.1`), which resolvers would not look up as names."""
    value = node.get(key, str)
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", value):
        raise node.child(key).error(f"'{value}' is not an IPv4 address (four numbers from 0 to 255, e.g. 10.0.0.7)")
    if not _HOSTNAME.match(value) or value.rsplit(".", 1)[-1].isdigit():
        raise node.child(key).error(f"'{value}' is not an IP address or host name")
    return value


def _path(node: Node, base: Path) -> Path:
    path = Path(os.path.normpath(base / Path(node.scalar(str)).expanduser()))
    if len(str(path)) > MAX_PATH_CHARS or any(len(part.encode()) > 255 for part in path.parts):
        raise node.error("is too long for a path")
    return path


def _stat(node: Node, path: Path) -> os.stat_result | None:
    """`path`'s status, or None if it does not exist."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise node.error(f"'{path}' cannot be checked ({err.strerror})") from None


def _directory(node: Node, base: Path) -> Path:
    """A folder on this machine edgetune writes into: a folder, or one it can make."""
    path = _path(node, base)
    _check_directory(node, path)
    return path


def _check_directory(node: Node, path: Path) -> None:
    found = _stat(node, path)
    if found is None:
        _check_makeable(node, path)
    elif not stat.S_ISDIR(found.st_mode):
        kind = "a file" if stat.S_ISREG(found.st_mode) else "a device or other special file"
        raise node.error(f"'{path}' is {kind}, not a folder; name a folder (it is made if missing)")


def _file(node: Node, base: Path) -> Path:
    """A file on this machine edgetune reads and writes: a regular file, or one it can make."""
    path = _path(node, base)
    found = _stat(node, path)
    if found is None:
        _check_makeable(node, path)
    elif not stat.S_ISREG(found.st_mode):
        kind = "a folder" if stat.S_ISDIR(found.st_mode) else "a device or other special file"
        raise node.error(f"'{path}' is {kind}, not a file")
    return path


def _check_makeable(node: Node, path: Path) -> None:
    """The nearest existing ancestor of a missing `path` must be a folder."""
    for parent in path.parents:
        found = _stat(node, parent)
        if found is not None:
            if not stat.S_ISDIR(found.st_mode):
                raise node.error(f"'{path}' cannot be made: '{parent}' is not a folder")
            return


def _check_ssh_files(root: Node, fleet: Fleet) -> None:
    """Every board needs a known_hosts file (host keys are always checked) and a way to log
    in: a named private key that exists, is a private key, and is readable by its owner only;
    without one, an ssh config file (its IdentityFile) or a running ssh-agent. Keys of
    simulated boards are made by `edgetune sim up`, so they must be named but may not exist yet."""
    for index, board in enumerate(fleet.boards):
        if board.ssh.known_hosts is None:
            raise _ssh_location(root, index, "known_hosts").error(
                "required field is missing: the file that records the boards' SSH host keys, e.g. .edgetune/known_hosts"
            )
        where = _ssh_location(root, index, "key")
        key = board.ssh.key
        if key is None:
            _check_other_key_source(where, board)
            continue
        found = _stat(where, key)
        if found is None:
            if board.simulated is not None:
                continue
            raise where.error(f"private key file '{key}' does not exist")
        _check_private_key(where, key, found)


def _check_other_key_source(where: Node, board: Board) -> None:
    """A board without ssh.key logs in with its ssh config's IdentityFile or the agent's keys."""
    if board.simulated is not None:
        raise where.error("required field is missing: a simulated board needs the private key `edgetune sim up` "
                          "makes and authorizes on it, e.g. .edgetune/sim/id_ed25519")
    if board.ssh.config is None and not os.environ.get("SSH_AUTH_SOCK"):
        raise where.error("required field is missing: the private key used to log in to the board (or an ssh config "
                          "file, ssh.config, whose IdentityFile names it, or a running ssh-agent, SSH_AUTH_SOCK)")


def _check_private_key(where: Node, key: Path, found: os.stat_result) -> None:
    if not stat.S_ISREG(found.st_mode):
        raise where.error(f"private key file '{key}' is not a file")
    if found.st_size > MAX_KEY_FILE_BYTES:
        raise where.error(f"'{key}' is {found.st_size} bytes, too large for a private key")
    mode = stat.S_IMODE(found.st_mode)
    if mode & 0o077:
        raise where.error(f"private key file '{key}' is readable by group or others (mode {mode:04o}); run: chmod 600 {key}")
    try:
        head = key.read_bytes()[:MAX_KEY_FILE_BYTES]
    except OSError as err:
        raise where.error(f"private key file '{key}' cannot be read ({err.strerror})") from None
    if head.lstrip().startswith((b"ssh-", b"ecdsa-", b"sk-")) or b"PUBLIC KEY-----" in head:
        raise where.error(f"'{key}' is a public key; name the private key (usually the same name without .pub)")
    if not _PRIVATE_KEY_PEM.match(head.lstrip()):
        raise where.error(f"'{key}' is not a PEM private key (no '-----BEGIN ... PRIVATE KEY-----' line); make one with ssh-keygen -t ed25519")


def _ssh_location(root: Node, index: int, field: str) -> Node:
    """The YAML place a board's ssh `field` comes from: its own ssh override, else the fleet's."""
    board = root.value["boards"][index]
    if isinstance(board.get("ssh"), dict) and board["ssh"].get(field) is not None:
        return Node(board["ssh"][field], root.file, f"boards[{index}].ssh.{field}")
    return Node((root.value.get("ssh") or {}).get(field), root.file, f"ssh.{field}")
