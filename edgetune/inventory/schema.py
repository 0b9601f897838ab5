"""The fleet inventory and device profiles as immutable, typed records (schema version 1).

Pure data: nothing here touches a machine, SSH or TVM. Each record is also the schema of the
YAML mapping it is read from: its fields are the keys allowed there, with their types, defaults
and `rule`s (allowed values, ranges, checks of single values), applied by
`artifact_format.codec.decode`; its `record_problem`, if it has one, says what its values may
not say of each other (`loader.py` tells it at its YAML path). `loader.py` also derives what the file spells another way (a board's inherited ssh settings, paths
resolved against fleet.yaml, `derived_field`s); everything downstream trusts the records.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.artifact_format.codec import FrozenMap, derived_field, join_path, rule
from edgetune.inventory.fields import (
    address_problem,
    bind_problem,
    env_name_problem,
    host_interface_problem,
    interface_problem,
    name_problem,
    port_problem,
    ray_address_problem,
    url_problem,
)
from edgetune.inventory.workdir import Workdir

SCHEMA_VERSION = 1

# Caps on counts and durations: far above any real fleet, far below what overflows or hangs.
MAX_TRIALS = 1_000_000
MAX_EARLY_STOP_GAIN = 0.99  # a task improving by less than this over the window stops
MAX_MEASURE_NUMBER = 10_000
MAX_MEASURE_REPEAT = 1_000
MAX_COMPARE_ROUNDS = 100
MAX_MS = 60_000
MAX_CPU_QUOTA = 64.0  # cores
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
MAX_LABELS = 64
SIM_ARCHES = ("x86_64", "aarch64")

BUILTIN_MODELS = ("mlp", "mobilenet-mini", "transformer-block")
DTYPES = ("float32", "float16", "int8", "uint8", "int32", "int64")
HOST_KEY_POLICIES = ("strict",)
# How the tracker, RPC and downloads reach a board: over its SSH connection, directly on its
# address, or (auto, the default) over SSH where the board is reached through a bastion.
TRANSPORTS = ("ssh", "direct", "auto")
NO_SSH_CONFIG = "none"  # `ssh.config: none`: no OpenSSH client config file, not even ~/.ssh/config
DEFAULT_TRIALS_PER_ITER = 16  # trials per round (tuning.trials_per_iter) when not set
DEFAULT_PARALLEL = (
    16  # boards a rollout drives at once by default, at least (fleet.parallel.MAX_WORKERS, every other fan-out's)
)
BOARDS_PER_WORKER = 20  # beyond 320 boards, the default width grows: one more board at once per 20 boards
MAX_DEFAULT_PARALLEL = 128
MAX_PARALLEL = 1024
POOL, TARGET = "pool", "target"  # a board's role: it tunes and measures its class's builds, or only runs them
DEFAULT_ROUNDS_PER_TASK = 1  # rounds per task when no trials_per_task, trials_per_class or time_limit_s is set:
# a round of the default 16 trials (twice the 8 per task the bench models were tuned with) keeps a
# 60-task model at 960 trials, about half an hour at the ~1.5-2 s per trial measured on simulated boards
PIN = "a mapping of model name to artifact version, e.g. {mlp: 3}"
LABELS = "a mapping of label name to value, e.g. {site: berlin, tier: field}"
TUNING_POOL = (
    "a list of the class's board names or selectors key=value[,key=value...], e.g. [lab-1, lab-2] or [role=lab]"
)


Problem = tuple[
    tuple[str | int, ...], str
]  # `record_problem()`: the keys of the place it is told at, and what is wrong


def at_least_one(what: str) -> Any:
    return lambda items: None if items else f"at least one {what} is required"


def _pool_problem(pool: tuple[str, ...]) -> str | None:
    if pool:
        return None
    return (
        "is empty: a class whose pool has no board can be neither tuned nor measured; name at least one of "
        "its boards, or leave tuning_pool out (every board of the class tunes)"
    )


def _keep_problem(keep: int) -> str | None:
    if 2 <= keep <= MAX_KEEP_RELEASES:
        return None
    return f"must be between 2 (the current and the previous release) and {MAX_KEEP_RELEASES}, got {keep}"


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
class Runtime:
    threads: int = rule(positive=True, maximum=MAX_THREADS)


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """What a board type is: its TVM target, how to export for it, how to time it (a profile
    file; its `version` is checked before it is decoded)."""

    name: str = rule(check=name_problem)
    path: Path = derived_field(Path())  # the profile file
    description: str = ""
    target: Mapping[str, Any] = rule(
        expect="a TVM target as a mapping, e.g. {kind: llvm, mcpu: cortex-a72, num-cores: 4}"
    )
    cross_compiler: str | None  # the file's `host` is None: the host compiler
    runtime: Runtime
    measurement: Measurement = field(default_factory=Measurement)
    firmware_command: str
    hardware: Mapping[str, Any] = rule(
        factory=FrozenMap, expect="a mapping of free-form facts (cores, caches, memory ...)"
    )

    @property
    def runtime_threads(self) -> int:
        return self.runtime.threads

    def target_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.target.items()}


@dataclass(frozen=True)
class Tracker:
    """A TVM RPC tracker run on the host; boards register with it at `public_address`, on a
    port from `port` to `port_end` (fleet.yaml may leave it out: port + 9)."""

    name: str = rule(check=name_problem)
    bind_host: str = rule(check=address_problem)
    public_address: str = rule(check=address_problem)
    port: int = rule(check=port_problem)
    port_end: int = rule(check=port_problem)

    def record_problem(self) -> Problem | None:
        if self.port_end < self.port:
            return ("port_end",), f"must be at least port ({self.port}), got {self.port_end}"
        return None


@dataclass(frozen=True)
class SshSettings:
    """How the host reaches a board. Secrets are never in YAML, only the name of a variable.
    `user`, `port` and `key` are None where fleet.yaml leaves them unset: the OpenSSH client
    config file `config` may set them then (fleet/ssh_route.py resolves them, root and 22
    last). `config` None: no config file (fleet.yaml's `none`; where it names none, ~/.ssh/config
    if there is one). A board's settings are its own where given, else the fleet's."""

    user: str | None = None
    port: int | None = rule(None, check=port_problem)
    key: Path | None = None
    known_hosts: Path | None = None
    config: Path | None = None
    host_key_policy: str = rule("strict", allowed=HOST_KEY_POLICIES)
    passphrase_env: str | None = rule(None, check=env_name_problem)
    connect_timeout_s: float = rule(10.0, positive=True, maximum=MAX_CONNECT_TIMEOUT_S)
    command_timeout_s: float = rule(120.0, positive=True, maximum=MAX_COMMAND_TIMEOUT_S)
    transport: str = rule("ssh", allowed=TRANSPORTS)  # or "direct", or "auto" (ssh behind a bastion, else direct)


@dataclass(frozen=True)
class Simulation:
    """A board that `edgetune sim up` creates on this machine (a network namespace + sshd)."""

    cpu_quota: float = rule(1.0, positive=True, maximum=MAX_CPU_QUOTA)  # fraction of one core, e.g. 0.5
    arch: str = rule(
        "x86_64", allowed=SIM_ARCHES
    )  # aarch64: an arm64 root file system run under qemu-user (see fleet/rootfs.py)

    @property
    def emulated(self) -> bool:
        return self.arch != "x86_64"


@dataclass(frozen=True)
class DeviceClass:
    """fleet.yaml names the profile file; the loader puts the profile read from it in its place."""

    name: str = rule(check=name_problem)
    profile: DeviceProfile = rule()  # required (`rule()`: no default, so that mypy sees the order is valid)
    pin: Mapping[str, int] = rule(
        factory=FrozenMap, expect=PIN
    )  # model -> artifact version every board of the class runs
    # the boards that tune and measure builds (fleet.yaml: names and selectors of the class's
    # boards, resolved by the loader); None: every board of the class
    tuning_pool: tuple[str, ...] | None = rule(None, expect=TUNING_POOL, max_items=MAX_BOARDS, check=_pool_problem)


@dataclass(frozen=True)
class Board:
    """fleet.yaml may leave `tracker` out where the fleet has one; `python` and `workdir` are
    paths on the board (on this machine for a simulated x86 board: relative to fleet.yaml)."""

    name: str = rule(check=name_problem)
    address: str = rule(check=address_problem)
    device_class: str = rule()  # required, as the next three
    tracker: str = rule()
    python: str = rule()
    workdir: str = rule()
    ssh: SshSettings = field(default_factory=SshSettings)
    threads: int | None = rule(None, positive=True, maximum=MAX_THREADS)  # overrides the profile's runtime threads
    simulated: Simulation | None = None
    pin: Mapping[str, int] = rule(
        factory=FrozenMap, expect=PIN
    )  # model -> artifact version this board runs (over its class's pin)
    token_env: str | None = rule(
        None, check=env_name_problem
    )  # its download token comes from this variable instead of a file
    # free-form name -> value, matched by `--select`
    labels: Mapping[str, str] = rule(factory=FrozenMap, expect=LABELS, max_items=MAX_LABELS)

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
    shape: tuple[int, ...] = rule(max_items=MAX_RANK)  # () for a scalar
    dtype: str = rule("float32", allowed=DTYPES)
    # None: the default reference values (fleet.yaml: {range: [low, high]} or {fixed: value}, read by the loader)
    values: ValueRange | FixedValue | None = None

    @property
    def fixed(self) -> bool:
        return isinstance(self.values, FixedValue)


QUANTIZED_WEIGHTS = ("keep", "float", "integer")  # int8 weights of quantized models: kept, widened to float32,
# or kept with the convolutions (groups 1) computed in integers (needs layout NHWC)
LAYOUTS = ("NCHW", "NHWC", "auto")  # the layout convolutions are compiled in (NCHW: as the graph has them;
# auto: chosen per model by edgetune.compiler.relax.layout)
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
    name: str = rule(check=name_problem)
    inputs: tuple[ModelInput, ...] = rule(max_items=MAX_INPUTS, check=at_least_one("input"))
    onnx: Path | None = None
    builtin: str | None = rule(None, allowed=BUILTIN_MODELS)
    weight: float = rule(1.0, positive=True, maximum=MAX_WEIGHT)
    reference_input: Path | None = None  # an .npz with one array per declared input
    quantized_weights: str = rule("keep", allowed=QUANTIZED_WEIGHTS)
    layout: str = rule(DEFAULT_LAYOUT, allowed=LAYOUTS)
    on_switch: str | None = None  # the shell command the board agent runs after each switch of `current`
    health: HealthCheck | None = None  # the health gate after an install's switch; None: none

    def record_problem(self) -> Problem | None:
        if (self.builtin is None) == (self.onnx is None):
            return (), "give exactly one of 'builtin' (a reference model name) or 'onnx' (a file path)"
        if self.quantized_weights == "integer" and self.layout == "NCHW":
            return ("quantized_weights",), (
                "'integer' computes convolutions in the NHWC micro-kernel; use 'layout: NHWC' "
                "or 'layout: auto' (layout is NCHW)"
            )
        return None

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
    included; `time_limit_s` ends a class's run cleanly; `early_stop` None: never (fleet.yaml:
    false)."""

    trials_per_class: int | None = rule(None, minimum=0, maximum=MAX_TRIALS)
    trials_per_class_override: Mapping[str, int] = rule(factory=FrozenMap)
    trials_per_iter: int = rule(DEFAULT_TRIALS_PER_ITER, positive=True, maximum=MAX_TRIALS_PER_ITER)
    max_trials_per_task: int | None = rule(None, positive=True, maximum=MAX_TRIALS)
    time_limit_s: float | None = rule(None, positive=True, maximum=MAX_TIME_LIMIT_S)
    borrow: Mapping[str, str] = rule(factory=FrozenMap)  # class -> class it may borrow tuning from
    trials_per_task: int | None = rule(None, positive=True, maximum=MAX_TRIALS)
    early_stop: EarlyStop | None = EarlyStop()

    def record_problem(self) -> Problem | None:
        """Trials per class from 0; a class borrows from another, and never round in a circle;
        the per-task budget in whole rounds, not above its cap, and not with trials_per_class."""
        for name, trials in self.trials_per_class_override.items():
            if not 0 <= trials <= MAX_TRIALS:
                return ("trials_per_class_override", name), f"must be between 0 and {MAX_TRIALS}, got {trials}"
        for name, lender in self.borrow.items():
            if lender == name:
                return ("borrow", name), "a class cannot borrow tuning from itself"
        return self._borrow_loop() or self._trials_per_task_problem()

    def _borrow_loop(self) -> Problem | None:
        """Borrowing may chain (c from b, b from a: tuned in that order) but never loop."""
        for start in self.borrow:
            chain = [start]
            while chain[-1] in self.borrow:
                lender = self.borrow[chain[-1]]
                if lender == start:
                    if len(chain) == 2:
                        return (
                            "borrow",
                            start,
                        ), f"'{start}' and '{lender}' borrow from each other; only one direction is allowed"
                    loop = " -> ".join([*chain, start])
                    return (
                        "borrow",
                        start,
                    ), f"borrowing goes round in a circle ({loop}); one of these classes must tune without borrowing"
                if lender in chain:
                    break  # a loop that does not pass through `start`: told from one of its members
                chain.append(lender)
        return None

    def _trials_per_task_problem(self) -> Problem | None:
        trials, per_iter, cap = self.trials_per_task, self.trials_per_iter, self.max_trials_per_task
        if trials is None:
            return None
        if self.trials_per_class is not None:
            return ("trials_per_task",), (
                "give either trials_per_task (trials each task gets) or trials_per_class "
                "(trials a class deals over its tasks), not both"
            )
        if trials % per_iter:
            lower, upper = max(trials // per_iter, 1) * per_iter, (trials // per_iter + 1) * per_iter
            return ("trials_per_task",), (
                f"must be a whole number of rounds of tuning.trials_per_iter ({per_iter}): MetaSchedule "
                f"measures a task a round at a time; use {lower} or {upper}, got {trials}"
            )
        if cap is not None and cap < trials:
            return ("max_trials_per_task",), (
                f"must be at least tuning.trials_per_task ({trials}): it caps a task, trials "
                f"moved to it included; got {cap}"
            )
        return None

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
        borrows from, when that class is among `names` too (`record_problem` refuses loops)."""
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
    a file per board under `tokens_dir` (`<board>.token`; fleet.yaml may leave it out: the
    workdir's) unless the board names a variable. HTTPS unless `deploy.tls: false` (then `tls`
    is None and the URL http://; fleet.yaml's `tls` is true or false, and the loader puts the
    files or None in its place)."""

    bind: str = rule(check=bind_problem)  # ADDRESS:PORT
    url: str = rule(check=url_problem)  # how boards reach the server, e.g. https://10.231.7.1:8470
    tokens_dir: Path = Workdir(Path()).tokens  # relative: inside the fleet's workdir
    keep_releases: int = rule(3, check=_keep_problem)
    tls: TlsFiles | None = None
    decision_ttl_s: int = rule(
        86400, positive=True, maximum=MAX_DECISION_TTL_S
    )  # how long a board may act on a signed decision
    # open at once, TLS handshakes included (`deploy.connections`), and from one IP address
    max_connections: int = rule(4096, between=(1, MAX_SERVER_CONNECTIONS))
    max_connections_per_client: int = rule(32, between=(1, MAX_SERVER_CONNECTIONS))
    header_timeout_s: float = rule(
        20.0, between=SERVER_TIMEOUT_S
    )  # from accept (TLS handshake included) to a complete request head
    keepalive_timeout_s: float = rule(
        5.0, between=SERVER_TIMEOUT_S
    )  # an idle connection between requests is closed after this
    # boards a rollout drives at once (`--parallel` overrides it); None: sized to the fleet
    parallel: int | None = rule(None, between=(1, MAX_PARALLEL))
    bind_host: str = derived_field("")  # `bind`'s ADDRESS and PORT
    port: int = derived_field(0)

    def record_problem(self) -> Problem | None:
        if self.max_connections_per_client > self.max_connections:
            return ("max_connections_per_client",), (
                f"is {self.max_connections_per_client}, more than deploy.max_connections ({self.max_connections}): "
                "one client may hold at most every connection the server holds"
            )
        return None

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

    threshold: float = rule(
        1.25,
        check=lambda ratio: (
            None
            if 1.0 <= ratio <= 100.0
            else f"is the time ratio that counts as slower, between 1.0 and 100 (e.g. 1.25), got {ratio}"
        ),
    )
    confidence: float = rule(
        0.95,
        check=lambda level: (
            None if 0.5 <= level <= 0.999 else f"must be between 0.5 and 0.999 (e.g. 0.95), got {level}"
        ),
    )


@dataclass(frozen=True)
class SimSettings:
    """The host side of a simulated fleet: one bridge, boards on its subnet."""

    bridge: str = rule(check=interface_problem)
    host_address: str = rule(
        check=host_interface_problem
    )  # the bridge's address, with prefix length, e.g. 10.231.0.1/24
    cache: Path = Path("/var/cache/edgetune")  # emulated boards' root file systems (kept by `sim down`)

    def board_address_problem(self, address: str) -> str | None:
        """A simulated board's address: a free one in the network."""
        host = ipaddress.IPv4Interface(self.host_address)
        network = host.network
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return f"a simulated board needs an IPv4 address in {network}, got '{address}'"
        if ip not in network or ip in (host.ip, network.network_address, network.broadcast_address):
            return f"'{address}' is not a free board address in the simulated network {network}"
        return None


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

    address: str = rule(
        check=ray_address_problem
    )  # the head's HOST:PORT (`ray start --head --port`), or ray://HOST:PORT
    cpus_per_class: float = rule(1.0, positive=True, maximum=MAX_RAY_CPUS)
    build_workers: int = rule(4, positive=True, maximum=MAX_BUILD_WORKERS)
    cpus_per_build: float = rule(1.0, positive=True, maximum=MAX_RAY_CPUS)
    connect_timeout_s: float = rule(60.0, positive=True, maximum=MAX_RAY_CONNECT_S)
    shards_per_class: int = rule(1, positive=True, maximum=MAX_SHARDS)


LOCAL_COMPUTE = "local"  # fleet.yaml's `compute: local`, the default


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """fleet.yaml (its `version` is checked before it is decoded)."""

    path: Path = derived_field(Path())  # fleet.yaml itself
    name: str = rule(check=name_problem)
    workdir: Path = Path(".edgetune")  # a relative default is beside fleet.yaml (the loader resolves it)
    sim: SimSettings | None = None
    trackers: tuple[Tracker, ...] = rule(max_items=MAX_TRACKERS, check=at_least_one("tracker"))
    # what a board's own `ssh` does not say; each board holds the settings it inherits, so two
    # fleets with the same boards are equal whatever their sections say
    ssh: SshSettings = field(default_factory=SshSettings, compare=False)
    device_classes: tuple[DeviceClass, ...] = rule(max_items=MAX_CLASSES, check=at_least_one("device class"))
    boards: tuple[Board, ...] = rule(max_items=MAX_BOARDS, check=at_least_one("board"))
    models: tuple[Model, ...] = rule(max_items=MAX_MODELS, check=at_least_one("model"))
    tuning: TuningPolicy
    artifacts: ArtifactSettings
    deploy: DeploySettings | None = None
    regress: RegressSettings = field(default_factory=RegressSettings)
    # None: `compute: local`, everything on this host (fleet.yaml: local, or {ray: {...}}, read by the loader)
    compute: RayCompute | None = None

    def record_problem(self) -> Problem | None:
        """What the sections say of each other: unique names, declared classes, trackers and
        models, simulated boards in the simulated network."""
        for section, field_name, what in _UNIQUE:
            problem = _duplicate((section,), getattr(self, section), field_name, what)
            if problem:
                return problem
        for index, model in enumerate(self.models):
            problem = _duplicate(("models", index, "inputs"), model.inputs, "name", "input")
            if problem:
                return problem
        return self._boards_problem() or self._pins_problem() or self._tuning_problem()

    def _boards_problem(self) -> Problem | None:
        classes, trackers = [c.name for c in self.device_classes], [t.name for t in self.trackers]
        tokens: dict[str, str] = {}  # variable -> the first board that reads it
        for index, board in enumerate(self.boards):
            problem = (
                _undeclared(("boards", index, "device_class"), board.device_class, classes, "device class")
                or _undeclared(("boards", index, "tracker"), board.tracker, trackers, "tracker")
                or (self._simulation_problem(index, board) if board.simulated is not None else None)
            )
            if problem:
                return problem
            first = tokens.setdefault(board.token_env, board.name) if board.token_env is not None else board.name
            if first != board.name:  # two boards would share one download token
                return ("boards", index, "token_env"), (
                    f"${board.token_env} is also the token variable of board {first}: "
                    f"boards {first} and {board.name} would share one download token; give each its own"
                )
        return None

    def _simulation_problem(self, index: int, board: Board) -> Problem | None:
        """A simulated board needs the sim section and a free address in its network; an emulated
        one runs what its class's target compiles for, and nothing else."""
        if self.sim is None or board.simulated is None:
            return (
                "boards",
                index,
                "simulated",
            ), "a simulated board needs the top-level 'sim' section (bridge, host_address)"
        simulated, device_class = board.simulated, self.device_class(board.device_class)
        triple = str(device_class.profile.target.get("mtriple", ""))
        if simulated.emulated and not triple.startswith(simulated.arch):
            return ("boards", index, "simulated", "arch"), (
                f"an {simulated.arch} board needs a device class whose profile targets {simulated.arch}; class "
                f"'{device_class.name}' ({device_class.profile.path}) targets '{triple or 'the host'}'"
            )
        problem = self.sim.board_address_problem(board.address)
        return (("boards", index, "address"), problem) if problem else None

    def class_without_boards(self) -> Problem | None:
        """A class without boards can be neither tuned nor measured: a forgotten board or class
        (told once the boards' own places are checked, `loader.py`)."""
        for index, device_class in enumerate(self.device_classes):
            if not self.boards_of(device_class.name):
                return ("device_classes", index), (
                    f"class '{device_class.name}' has no boards, so it can be neither tuned nor measured; add a board "
                    f"with device_class: {device_class.name}, or remove the class"
                )
        return None

    def _pins_problem(self) -> Problem | None:
        """What a class or board pins is a declared model."""
        models = [m.name for m in self.models]
        pinned = [(("device_classes", i), c.pin) for i, c in enumerate(self.device_classes)]
        pinned += [(("boards", i), b.pin) for i, b in enumerate(self.boards)]
        for where, pin in pinned:
            for model in pin:
                problem = _undeclared((*where, "pin", model), model, models, "model")
                if problem:
                    return problem
        return None

    def _tuning_problem(self) -> Problem | None:
        """The keys of the per-class settings, and what a class borrows from, are declared classes."""
        classes = [c.name for c in self.device_classes]
        for section in ("trials_per_class_override", "borrow"):
            for key in getattr(self.tuning, section):
                if key not in classes:
                    hint = difflib.get_close_matches(key, classes, n=1)
                    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                    return ("tuning", section, key), f"unknown key{suggestion}; allowed here: {', '.join(classes)}"
        for name, lender in self.tuning.borrow.items():
            problem = _undeclared(("tuning", "borrow", name), lender, classes, "device class")
            if problem:
                return problem
        return None

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


_UNIQUE = (
    ("trackers", "name", "tracker"),
    ("device_classes", "name", "device class"),
    ("boards", "name", "board"),
    ("boards", "address", "board address"),
    ("models", "name", "model"),
)


def _duplicate(place: tuple[str | int, ...], items: Sequence[Any], field_name: str, what: str) -> Problem | None:
    """The first of `items` (at `place`) whose `field_name` an earlier one has."""
    seen: dict[Any, int] = {}
    for index, item in enumerate(items):
        value = getattr(item, field_name)
        if value in seen:
            first = functools.reduce(join_path, (*place, seen[value], field_name), "")
            return (*place, index, field_name), f"duplicate {what} '{value}' (first defined at {first})"
        seen[value] = index
    return None


def _undeclared(place: tuple[str | int, ...], value: str, names: list[str], what: str) -> Problem | None:
    return None if value in names else (place, f"'{value}' is not a declared {what} (declared: {', '.join(names)})")
