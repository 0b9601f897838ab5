"""The fleet inventory and device profiles as immutable, typed records (schema version 1).

Pure data: nothing here touches a machine, SSH or TVM. `loader.py` builds these from YAML and
validates them once; everything downstream trusts them. Records that fleet.yaml or a profile
spells out as they are carry their schema here (`rule`: allowed values, ranges, defaults),
decoded by `artifact_format.codec.decode`; the shapes of the files themselves are in
`documents.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import FrozenMap, rule
from edgetune.inventory.fields import (
    host_interface_problem,
    interface_problem,
    ray_address_problem,
)

SCHEMA_VERSION = 1

# Caps on counts and durations: far above any real fleet, far below what overflows or hangs.
MAX_TRIALS = 1_000_000
MAX_EARLY_STOP_GAIN = 0.99  # a task improving by less than this over the window stops
MAX_MEASURE_NUMBER = 10_000
MAX_MEASURE_REPEAT = 1_000
MAX_COMPARE_ROUNDS = 100
MAX_MS = 60_000
MAX_CPU_QUOTA = 64.0  # cores
SIM_ARCHES = ("x86_64", "aarch64")

BUILTIN_MODELS = ("mlp", "mobilenet-mini", "transformer-block")
DTYPES = ("float32", "float16", "int8", "uint8", "int32", "int64")
HOST_KEY_POLICIES = ("strict",)
# How the tracker, RPC and downloads reach a board: over its SSH connection, directly on its
# address, or (auto, the default) over SSH where the board is reached through a bastion.
TRANSPORTS = ("ssh", "direct", "auto")
NO_SSH_CONFIG = "none"  # `ssh.config: none`: no OpenSSH client config file, not even ~/.ssh/config
DEFAULT_TRIALS_PER_ITER = 16  # trials per round (tuning.trials_per_iter) when not set
DEFAULT_PARALLEL = 16  # boards a rollout drives at once by default, at least (fleet.parallel.MAX_WORKERS, every other fan-out's)
BOARDS_PER_WORKER = 20  # beyond 320 boards, the default width grows: one more board at once per 20 boards
MAX_DEFAULT_PARALLEL = 128
MAX_PARALLEL = 1024
POOL, TARGET = "pool", "target"  # a board's role: it tunes and measures its class's builds, or only runs them
DEFAULT_ROUNDS_PER_TASK = 1  # rounds per task when no trials_per_task, trials_per_class or time_limit_s is set:
# a round of the default 16 trials (twice the 8 per task the bench models were tuned with) keeps a
# 60-task model at 960 trials, about half an hour at the ~1.5-2 s per trial measured on simulated boards


@dataclass(frozen=True)
class CompareSettings:
    """How whole builds being compared (tuned vs untuned at build, deployed vs fresh at
    regress) are timed on a board: `rounds` rounds, the builds taking turns within each
    (A B, B A, A B ...), `repeat` samples per build per round, each sample the mean time of
    as many calls as fill `min_repeat_ms` (several CFS periods of 100 ms, so that a board's
    CPU quota is averaged over, not sampled)."""

    rounds: int = rule(4, positive=True, maximum=MAX_COMPARE_ROUNDS)
    repeat: int = rule(3, positive=True, maximum=MAX_MEASURE_REPEAT)
    min_repeat_ms: int = rule(300, positive=True, maximum=MAX_MS)


@dataclass(frozen=True)
class Measurement:
    """How a board is timed. `number`, `repeat`, `min_repeat_ms`: each tuning candidate
    (MetaSchedule's evaluator); `cooldown_ms`: pause after every repeat, tuning and
    comparisons alike; `compare`: whole builds compared with each other."""

    number: int = rule(3, positive=True, maximum=MAX_MEASURE_NUMBER)
    repeat: int = rule(5, positive=True, maximum=MAX_MEASURE_REPEAT)
    min_repeat_ms: int = rule(20, minimum=0, maximum=MAX_MS)
    cooldown_ms: int = rule(0, minimum=0, maximum=MAX_MS)
    compare: CompareSettings = CompareSettings()


@dataclass(frozen=True)
class DeviceProfile:
    """What a board type is: its TVM target, how to export for it, how to time it."""

    name: str
    path: Path
    description: str
    target: Mapping[str, Any]
    cross_compiler: str | None  # None: the host compiler
    runtime_threads: int
    measurement: Measurement
    firmware_command: str
    hardware: Mapping[str, Any]

    def target_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.target.items()}


@dataclass(frozen=True)
class Tracker:
    """A TVM RPC tracker run on the host; boards register with it at `public_address`."""

    name: str
    bind_host: str
    public_address: str
    port: int
    port_end: int


@dataclass(frozen=True)
class SshSettings:
    """How the host reaches a board. Secrets are never in YAML, only the name of a variable.
    `user`, `port` and `key` are None where fleet.yaml leaves them unset: the OpenSSH client
    config file `config` may set them then (fleet/ssh_route.py resolves them, root and 22
    last). `config` None: no config file."""

    user: str | None = None
    port: int | None = None
    key: Path | None = None
    known_hosts: Path | None = None
    config: Path | None = None
    host_key_policy: str = "strict"
    passphrase_env: str | None = None
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0
    transport: str = "ssh"  # or "direct", or "auto" (ssh behind a bastion, else direct)


@dataclass(frozen=True)
class Simulation:
    """A board that `edgetune sim up` creates on this machine (a network namespace + sshd)."""

    cpu_quota: float = rule(1.0, positive=True, maximum=MAX_CPU_QUOTA)  # fraction of one core, e.g. 0.5
    arch: str = rule("x86_64", allowed=SIM_ARCHES)  # aarch64: an arm64 root file system run under qemu-user (see fleet/rootfs.py)

    @property
    def emulated(self) -> bool:
        return self.arch != "x86_64"


@dataclass(frozen=True)
class DeviceClass:
    name: str
    profile: DeviceProfile
    pin: Mapping[str, int] = field(default_factory=FrozenMap)  # model -> artifact version every board of the class runs
    tuning_pool: tuple[str, ...] | None = None  # the boards that tune and measure builds; None: every board of the class


@dataclass(frozen=True)
class Board:
    name: str
    address: str
    device_class: str
    tracker: str
    python: str
    workdir: str
    ssh: SshSettings
    threads: int | None = None  # overrides the profile's runtime threads
    simulated: Simulation | None = None
    pin: Mapping[str, int] = field(default_factory=FrozenMap)  # model -> artifact version this board runs (over its class's pin)
    token_env: str | None = None  # its download token comes from this variable instead of a file
    labels: Mapping[str, str] = field(default_factory=FrozenMap)  # free-form name -> value, matched by `--select`

    @property
    def shares_host_cpus(self) -> bool:
        """A simulated board: it runs on this machine, so the host's own work slows its timing."""
        return self.simulated is not None

    @property
    def emulated(self) -> bool:
        """A simulated board of another architecture, run under qemu-user (its timings are qemu's)."""
        return self.simulated is not None and self.simulated.emulated


@dataclass(frozen=True)
class ValueRange:
    """The values an input takes: drawn uniformly from [low, high] for the reference input."""

    low: float | int
    high: float | int


@dataclass(frozen=True)
class FixedValue:
    """An input that always has one value: baked into the model as a constant before import."""

    value: float | int


@dataclass(frozen=True)
class ModelInput:
    name: str
    shape: tuple[int, ...]  # () for a scalar
    dtype: str = "float32"
    values: ValueRange | FixedValue | None = None  # None: the default reference values

    @property
    def fixed(self) -> bool:
        return isinstance(self.values, FixedValue)


QUANTIZED_WEIGHTS = ("keep", "float", "integer")  # int8 weights of quantized models: kept, widened to float32,
# or kept with the convolutions (groups 1) computed in integers (needs layout NHWC)
LAYOUTS = ("NCHW", "NHWC", "auto")  # the layout convolutions are compiled in (NCHW: as the graph has them;
# auto: chosen per model by edgetune.compiler.layout)
DEFAULT_LAYOUT = "auto"


HEALTH_TIMEOUT_S = (1.0, 3600.0)  # the range of a health check's `timeout_s`
DEFAULT_HEALTH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class HealthCheck:
    """A model's health gate (`models[].health`): the shell command the board agent runs after
    switching to a new release (and its `on_switch`); a non-zero exit, or no exit within
    `timeout_s`, switches the board back (docs/app.md#health-checks)."""

    command: str  # blank, over-long and control-character strings are refused by the reader
    timeout_s: float = rule(DEFAULT_HEALTH_TIMEOUT_S, between=HEALTH_TIMEOUT_S)


@dataclass(frozen=True)
class Model:
    name: str
    inputs: tuple[ModelInput, ...]
    onnx: Path | None = None
    builtin: str | None = None
    weight: float = 1.0
    reference_input: Path | None = None  # an .npz with one array per declared input
    quantized_weights: str = "keep"
    layout: str = DEFAULT_LAYOUT
    on_switch: str | None = None  # the shell command the board agent runs after each switch of `current`
    health: HealthCheck | None = None  # the health gate after an install's switch; None: none

    @property
    def fed_inputs(self) -> tuple[ModelInput, ...]:
        """The inputs the built model takes, in order (fixed inputs are baked in)."""
        return tuple(i for i in self.inputs if not i.fixed)


@dataclass(frozen=True)
class EarlyStop:
    """A task stops at its knee: when its best latency improved by less than `min_gain` (a
    fraction of it) over its last `window` measured trials; its unspent trials go to tasks
    that still gain."""

    window: int = rule(32, positive=True, maximum=MAX_TRIALS)
    min_gain: float = rule(0.02, between=(0.0, MAX_EARLY_STOP_GAIN))


@dataclass(frozen=True)
class TuningPolicy:
    """How many trials each task of a class gets (see `task_budget_rule`), in rounds of
    `trials_per_iter`; `max_trials_per_task` caps a task, trials moved to it by early stops
    included; `time_limit_s` ends a class's run cleanly; `early_stop` None: never."""

    trials_per_class: int | None
    trials_per_class_override: Mapping[str, int]
    trials_per_iter: int
    max_trials_per_task: int | None
    time_limit_s: float | None
    borrow: Mapping[str, str]  # class -> class it may borrow tuning from
    trials_per_task: int | None = None
    early_stop: EarlyStop | None = EarlyStop()

    def trials_for(self, device_class: str) -> int | None:
        """The class-wide trials of a class, None when its budget is per task."""
        return self.trials_per_class_override.get(device_class, self.trials_per_class)

    def task_budget_rule(self, device_class: str) -> tuple[str, int]:
        """("per_task", trials each task gets) or ("per_class", class-wide trials dealt over
        the tasks a round at a time, at least a round per task). A class's override is
        class-wide; otherwise `trials_per_task`, else `trials_per_class`, else
        DEFAULT_ROUNDS_PER_TASK rounds per task."""
        class_wide = self.trials_for(device_class)
        if class_wide is not None and (self.trials_per_task is None or device_class in self.trials_per_class_override):
            return "per_class", class_wide
        return "per_task", self.trials_per_task or DEFAULT_ROUNDS_PER_TASK * self.trials_per_iter

    def borrow_stages(self, names: Sequence[str]) -> list[list[str]]:
        """`names` in the order they can be tuned: each class in a stage after the class it
        borrows from, when that class is among `names` too (the loader refuses loops)."""
        stages, pending = [], list(names)
        while pending:
            ready = [n for n in pending if self.borrow.get(n) not in pending] or pending
            stages.append(ready)
            pending = [n for n in pending if n not in ready]
        return stages


@dataclass(frozen=True)
class ArtifactSettings:
    dir: Path
    signing_key: Path
    public_key: Path


@dataclass(frozen=True)
class TlsFiles:
    """The fleet CA and the server's certificate, beside the signing key (`edgetune keys init`
    makes them): boards pin `ca_cert`; `edgetune serve` presents `server_cert`."""

    ca_cert: Path  # fleet-ca.pem
    ca_key: Path  # fleet-ca.key (mode 0600)
    server_cert: Path  # server.pem, signed by the CA, names: deploy.url's and deploy.bind's hosts
    server_key: Path  # server.key (mode 0600)

    @classmethod
    def beside(cls, signing_key: Path) -> TlsFiles:
        keys = Path(signing_key).parent
        return cls(keys / "fleet-ca.pem", keys / "fleet-ca.key", keys / "server.pem", keys / "server.key")


@dataclass(frozen=True)
class DeploySettings:
    """The artifact server boards download from, and what boards keep. Tokens are secrets:
    a file per board under `tokens_dir` (`<board>.token`) unless the board names a variable.
    HTTPS unless `deploy.tls: false` (then `tls` is None and the URL http://)."""

    bind_host: str
    port: int
    url: str  # how boards reach the server, e.g. https://10.231.7.1:8470
    tokens_dir: Path
    keep_releases: int = 3
    tls: TlsFiles | None = None
    decision_ttl_s: int = 86400  # how long a board may act on a signed decision of the server
    max_connections: int = 4096  # open at once, TLS handshakes included (`deploy.connections`)
    max_connections_per_client: int = 32  # open at once from one IP address
    header_timeout_s: float = 20.0  # from accept (TLS handshake included) to a complete request head
    keepalive_timeout_s: float = 5.0  # an idle connection between requests is closed after this
    parallel: int | None = None  # boards a rollout drives at once (`--parallel` overrides it); None: sized to the fleet

    def parallel_for(self, boards: int) -> int:
        """Boards driven at once among `boards`: `parallel`, else 16, growing with fleets of
        more than 320 boards by one per 20, to 128."""
        if self.parallel is not None:
            return self.parallel
        return min(MAX_DEFAULT_PARALLEL, max(DEFAULT_PARALLEL, -(-boards // BOARDS_PER_WORKER)))


@dataclass(frozen=True)
class RegressSettings:
    """How `edgetune regress` judges a board's latency against its artifact's baseline: slower
    when the whole confidence interval of the time ratio lies above `threshold`."""

    threshold: float = rule(1.25, check=lambda ratio: None if 1.0 <= ratio <= 100.0 else
                            f"is the time ratio that counts as slower, between 1.0 and 100 (e.g. 1.25), got {ratio}")
    confidence: float = rule(0.95, check=lambda level: None if 0.5 <= level <= 0.999 else
                             f"must be between 0.5 and 0.999 (e.g. 0.95), got {level}")


@dataclass(frozen=True)
class SimSettings:
    """The host side of a simulated fleet: one bridge, boards on its subnet."""

    bridge: str = rule(check=interface_problem)
    host_address: str = rule(check=host_interface_problem)  # the bridge's address, with prefix length, e.g. 10.231.0.1/24
    cache: Path = Path("/var/cache/edgetune")  # emulated boards' root file systems (kept by `sim down`)


MAX_RAY_CPUS = 1024.0
MAX_BUILD_WORKERS = 1024
MAX_SHARDS = 256
MAX_RAY_CONNECT_S = 3600.0


@dataclass(frozen=True)
class RayCompute:
    """`compute: {ray: ...}`: tune on an existing Ray cluster (docs/compute.md). Each class's
    run is a Ray task of `cpus_per_class` CPUs (its search and cost model); its candidate builds
    are Ray tasks of `cpus_per_build` CPUs, at most `build_workers` of a class at a time. With
    `shards_per_class` above 1, a class run splits its search into that many Ray tasks of
    `cpus_per_class` CPUs, each searching its share of the tasks (at most one per task)."""

    address: str = rule(check=ray_address_problem)  # the head's HOST:PORT (`ray start --head --port`), or ray://HOST:PORT
    cpus_per_class: float = rule(1.0, positive=True, maximum=MAX_RAY_CPUS)
    build_workers: int = rule(4, positive=True, maximum=MAX_BUILD_WORKERS)
    cpus_per_build: float = rule(1.0, positive=True, maximum=MAX_RAY_CPUS)
    connect_timeout_s: float = rule(60.0, positive=True, maximum=MAX_RAY_CONNECT_S)
    shards_per_class: int = rule(1, positive=True, maximum=MAX_SHARDS)


@dataclass(frozen=True)
class Fleet:
    path: Path
    name: str
    workdir: Path
    trackers: tuple[Tracker, ...]
    device_classes: tuple[DeviceClass, ...]
    boards: tuple[Board, ...]
    models: tuple[Model, ...]
    tuning: TuningPolicy
    artifacts: ArtifactSettings
    sim: SimSettings | None
    deploy: DeploySettings | None = None
    regress: RegressSettings = RegressSettings()
    compute: RayCompute | None = None  # None: `compute: local`, everything on this host

    def device_class(self, name: str) -> DeviceClass:
        return next(c for c in self.device_classes if c.name == name)

    def tracker(self, name: str) -> Tracker:
        return next(t for t in self.trackers if t.name == name)

    def boards_of(self, device_class: str) -> tuple[Board, ...]:
        return tuple(b for b in self.boards if b.device_class == device_class)

    def pool_of(self, device_class: str) -> tuple[Board, ...]:
        """The boards of `device_class` that tune and measure its builds (its tuning pool)."""
        return tuple(b for b in self.boards_of(device_class) if self.in_pool(b))

    def in_pool(self, board: Board) -> bool:
        pool = self.device_class(board.device_class).tuning_pool
        return pool is None or board.name in pool

    def role(self, board: Board) -> str:
        """POOL for a board of its class's tuning pool, TARGET for a board that only runs releases."""
        return POOL if self.in_pool(board) else TARGET

    def board(self, name: str) -> Board:
        return next(b for b in self.boards if b.name == name)

    def simulated_boards(self) -> tuple[Board, ...]:
        return tuple(b for b in self.boards if b.simulated is not None)

    def replace(self, **changes: Any) -> Fleet:
        return dataclasses.replace(self, **changes)
