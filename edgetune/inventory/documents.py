"""The shapes of fleet.yaml and of a device profile, as the schema decoder reads them.

Each class is one mapping of a file, its fields the keys allowed there, with their types,
defaults and `rule`s (allowed values, ranges, checks of single values). `codec.decode` turns a
file's YAML data into these, refusing any misfit with its YAML path; `loader.py` then applies
the rules that span fields or files (unique names, declared classes and models, paths that
must exist, the ssh settings a board inherits) and builds the `schema` records. Records that
the files spell out as they are (Measurement, Simulation, EarlyStop ...) are used directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import FrozenMap, rule
from edgetune.inventory.fields import (
    address_problem,
    env_name_problem,
    name_problem,
    port_problem,
)
from edgetune.inventory.schema import (
    BUILTIN_MODELS,
    DEFAULT_LAYOUT,
    DEFAULT_TRIALS_PER_ITER,
    DTYPES,
    HOST_KEY_POLICIES,
    LAYOUTS,
    MAX_PARALLEL,
    MAX_TRIALS,
    QUANTIZED_WEIGHTS,
    TRANSPORTS,
    DeploySettings,
    EarlyStop,
    HealthCheck,
    Measurement,
    RayCompute,
    RegressSettings,
    SimSettings,
    Simulation,
)

MAX_TRACKERS = 64
MAX_CLASSES = 256
MAX_BOARDS = 10_000
MAX_MODELS = 256
MAX_INPUTS = 64
MAX_RANK = 8
MAX_THREADS = 1024
MAX_TRIALS_PER_ITER = 10_000
MAX_WEIGHT = 1e6
MAX_TIME_LIMIT_S = 30 * 86_400.0
MAX_CONNECT_TIMEOUT_S = 3_600.0
MAX_COMMAND_TIMEOUT_S = 86_400.0
MAX_DECISION_TTL_S = 30 * 86400
MAX_KEEP_RELEASES = 100
MAX_SERVER_CONNECTIONS = 65_536
SERVER_TIMEOUT_S = (0.1, 600.0)
PIN = "a mapping of model name to artifact version, e.g. {mlp: 3}"
MAX_LABELS = 64
LABELS = "a mapping of label name to value, e.g. {site: berlin, tier: field}"


def at_least_one(what: str) -> Any:
    return lambda items: None if items else f"at least one {what} is required"


def name_field() -> Any:
    return rule(check=name_problem)


def pin_field() -> Any:
    return rule(factory=FrozenMap, expect=PIN)


# -- a device profile ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Runtime:
    threads: int = rule(positive=True, maximum=MAX_THREADS)


@dataclass(frozen=True, kw_only=True)
class ProfileFile:
    version: int
    name: str = name_field()
    description: str = ""
    target: Mapping[str, Any] = rule(expect="a TVM target as a mapping, e.g. {kind: llvm, mcpu: cortex-a72, num-cores: 4}")
    cross_compiler: str  # `host`: the host compiler
    runtime: Runtime
    measurement: Measurement = field(default_factory=Measurement)
    firmware_command: str
    hardware: Mapping[str, Any] = rule(factory=FrozenMap, expect="a mapping of free-form facts (cores, caches, memory ...)")


# -- fleet.yaml ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TrackerEntry:
    name: str = name_field()
    bind_host: str = rule(check=address_problem)
    public_address: str = rule(check=address_problem)
    port: int = rule(check=port_problem)
    port_end: int | None = rule(None, check=port_problem)  # None: port + 9


@dataclass(frozen=True, kw_only=True)
class SshEntry:
    """The fleet's ssh settings, or a board's overrides of them: None where not given."""

    user: str | None = None
    port: int | None = rule(None, check=port_problem)
    key: Path | None = None
    known_hosts: Path | None = None
    config: str | None = None  # a file, or `none`
    host_key_policy: str | None = rule(None, allowed=HOST_KEY_POLICIES)
    passphrase_env: str | None = rule(None, check=env_name_problem)
    connect_timeout_s: float | None = rule(None, positive=True, maximum=MAX_CONNECT_TIMEOUT_S)
    command_timeout_s: float | None = rule(None, positive=True, maximum=MAX_COMMAND_TIMEOUT_S)
    transport: str | None = rule(None, allowed=TRANSPORTS)


TUNING_POOL = "a list of the class's board names or selectors key=value[,key=value...], e.g. [lab-1, lab-2] or [role=lab]"


def _pool_problem(pool: tuple[str, ...]) -> str | None:
    if pool:
        return None
    return ("is empty: a class whose pool has no board can be neither tuned nor measured; name at least one of "
            "its boards, or leave tuning_pool out (every board of the class tunes)")


@dataclass(frozen=True, kw_only=True)
class ClassEntry:
    name: str = name_field()
    profile: Path
    pin: Mapping[str, Any] = pin_field()
    # board names and selectors of the class's boards, resolved and checked by the loader; None: every board
    tuning_pool: tuple[str, ...] | None = rule(None, expect=TUNING_POOL, max_items=MAX_BOARDS, check=_pool_problem)


@dataclass(frozen=True, kw_only=True)
class BoardEntry:
    name: str = name_field()
    address: str = rule(check=address_problem)
    device_class: str
    tracker: str | None = None  # None: the only tracker
    python: str
    workdir: str
    ssh: SshEntry = field(default_factory=SshEntry)
    threads: int | None = rule(None, positive=True, maximum=MAX_THREADS)
    simulated: Simulation | None = None
    pin: Mapping[str, Any] = pin_field()
    token_env: str | None = rule(None, check=env_name_problem)
    labels: Mapping[str, Any] = rule(factory=FrozenMap, expect=LABELS, max_items=MAX_LABELS)  # checked by the loader


@dataclass(frozen=True, kw_only=True)
class InputValues:
    range: tuple[Any, ...] | None = rule(None, max_items=2)
    fixed: Any = None


@dataclass(frozen=True, kw_only=True)
class InputEntry:
    name: str
    shape: tuple[Any, ...] = rule(max_items=MAX_RANK)
    dtype: str = rule("float32", allowed=DTYPES)
    values: InputValues | None = None


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    name: str = name_field()
    builtin: str | None = rule(None, allowed=BUILTIN_MODELS)
    onnx: Path | None = None
    inputs: tuple[InputEntry, ...] = rule(max_items=MAX_INPUTS, check=at_least_one("input"))
    weight: float = rule(1.0, positive=True, maximum=MAX_WEIGHT)
    reference_input: Path | None = None
    quantized_weights: str | None = rule(None, allowed=QUANTIZED_WEIGHTS)  # None: keep
    layout: str = rule(DEFAULT_LAYOUT, allowed=LAYOUTS)
    on_switch: str | None = None  # a shell command (the reader refuses blank and over-long strings)
    health: HealthCheck | None = None


@dataclass(frozen=True, kw_only=True)
class TuningEntry:
    trials_per_task: int | None = rule(None, positive=True, maximum=MAX_TRIALS)
    trials_per_class: int | None = rule(None, minimum=0, maximum=MAX_TRIALS)
    trials_per_class_override: Mapping[str, int] = rule(factory=FrozenMap)
    trials_per_iter: int = rule(DEFAULT_TRIALS_PER_ITER, positive=True, maximum=MAX_TRIALS_PER_ITER)
    max_trials_per_task: int | None = rule(None, positive=True, maximum=MAX_TRIALS)
    early_stop: EarlyStop | bool = field(default_factory=EarlyStop)  # false: never (true is refused by the loader)
    time_limit_s: float | None = rule(None, positive=True, maximum=MAX_TIME_LIMIT_S)
    borrow: Mapping[str, str] = rule(factory=FrozenMap)


@dataclass(frozen=True, kw_only=True)
class ArtifactsEntry:
    dir: Path
    signing_key: Path
    public_key: Path


def _keep_problem(keep: int) -> str | None:
    if 2 <= keep <= MAX_KEEP_RELEASES:
        return None
    return f"must be between 2 (the current and the previous release) and {MAX_KEEP_RELEASES}, got {keep}"


@dataclass(frozen=True, kw_only=True)
class DeployEntry:
    bind: str  # ADDRESS:PORT
    url: str
    tokens_dir: Path | None = None  # None: the workdir's
    keep_releases: int = rule(DeploySettings.keep_releases, check=_keep_problem)
    tls: bool = True
    decision_ttl_s: int = rule(DeploySettings.decision_ttl_s, positive=True, maximum=MAX_DECISION_TTL_S)
    max_connections: int = rule(DeploySettings.max_connections, between=(1, MAX_SERVER_CONNECTIONS))
    max_connections_per_client: int = rule(DeploySettings.max_connections_per_client, between=(1, MAX_SERVER_CONNECTIONS))
    header_timeout_s: float = rule(DeploySettings.header_timeout_s, between=SERVER_TIMEOUT_S)
    keepalive_timeout_s: float = rule(DeploySettings.keepalive_timeout_s, between=SERVER_TIMEOUT_S)
    parallel: int | None = rule(None, between=(1, MAX_PARALLEL))


LOCAL_COMPUTE = "local"


def _compute_problem(value: object) -> str | None:
    if isinstance(value, str) and value != LOCAL_COMPUTE:
        return (f"'{value}' is not allowed (allowed: {LOCAL_COMPUTE}, or a mapping "
                "ray: {address: HOST:PORT, ...}; see docs/compute.md)")
    return None


@dataclass(frozen=True, kw_only=True)
class ComputeEntry:
    ray: RayCompute


@dataclass(frozen=True, kw_only=True)
class FleetFile:
    version: int
    name: str = name_field()
    workdir: Path | None = None  # None: .edgetune beside fleet.yaml
    sim: SimSettings | None = None
    trackers: tuple[TrackerEntry, ...] = rule(max_items=MAX_TRACKERS, check=at_least_one("tracker"))
    ssh: SshEntry = field(default_factory=SshEntry)
    device_classes: tuple[ClassEntry, ...] = rule(max_items=MAX_CLASSES, check=at_least_one("device class"))
    boards: tuple[BoardEntry, ...] = rule(max_items=MAX_BOARDS, check=at_least_one("board"))
    models: tuple[ModelEntry, ...] = rule(max_items=MAX_MODELS, check=at_least_one("model"))
    tuning: TuningEntry
    artifacts: ArtifactsEntry
    deploy: DeployEntry | None = None
    regress: RegressSettings = field(default_factory=RegressSettings)
    compute: ComputeEntry | str = rule(LOCAL_COMPUTE, check=_compute_problem)  # noqa: RUF009 (a dataclasses.field)
