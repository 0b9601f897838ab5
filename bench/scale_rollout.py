"""A rollout at scale on this machine: N simulated boards (default 200), 10 % of them switched off.

What it does, in order (every step through the library, as `edgetune` runs it):
1. a fleet of N simulated boards (`edgetune sim up`'s `sim_up`: a network namespace with its own
   sshd per board, one bridge, a /22 so up to ~1,000 boards fit), whose Python is a board image
   (tests/support/board_image.py: a venv with only a board's packages, never the host's); no tracker
   and no rpc_server (no `fleet up`: a rollout needs neither);
2. one model, the built-in mlp, as a real signed version per class: compiled on this host
   (untuned: no tuning run, no board measurement), with its reference input and expected
   output, so each board's install runs the real reference check;
3. the real artifact server, `edgetune serve`, as a process of its own (its RSS read from
   /proc, its access log one JSON line per request);
4. pull timers on every board, or with `--timers offline` only on those taken off
   (`install_timers`; on simulated boards the agent's own loop, `sync --every PERIOD`), then the
   links of --offline-pct of the boards down (every k-th board, the first one included: its
   class's canary is replaced); with timers on every board and a period shorter than a stage,
   the stage's boards install the version by their timers first (bench/HISTORY.md, 2026-12-05);
5. `plan_rollout` + `rollout` of v1 (`--parallel`, default the fleet's: deploy.parallel, else sized to it),
   timed per stage and, by wrapping the library's calls in this process, per board and step:
   SSH connect, provisioning, the agent's status, its install (download, verification,
   reference check, switch), the final read-back, and the serialized writes of the fleet
   state and the intent journal;
6. the links back up, and the time until every pending board's timer has installed the version
   and reported it to the server (`load_reported`);
7. CPU seconds of the rollout (this process), the server and the boards (each board's sshd and
   the sessions it reaped, plus its timer loop), the cost of one state or journal write at N
   and at --extrapolate-to boards (measured on files of that size), and from all of it an
   estimate for --extrapolate-to boards, naming the part that bounds it.
It prints a table and a summary (CPU model, commit, command). Whatever happens (an error,
Ctrl-C, SIGTERM) it puts the links back up, removes the timers, stops the server and takes the
fleet down (`sim_down`), and removes its workdir unless --keep-workdir.

Run: .venv/bin/python bench/scale_rollout.py [--boards 200] [--offline-pct 10] [--parallel N]
                                            [--period 10] [--timers all|offline]
Root, openssh-server and the venv (`make setup`) are needed. Its fleet `scale` uses bridge
etune-scale and 10.232.0.0/22 (no test or other bench uses them), the server port 8640; it
holds the bench lock (/tmp/edgetune-bench.lock: one bench at a time) and its own.
tests/scale/test_scale_rollout.py runs the same scenario at 20 boards (`make test-scale`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import math
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
if str(REPO / "tests") not in sys.path:
    sys.path.insert(1, str(REPO / "tests"))

MODEL = "mlp"
PROFILE = REPO / "device_profiles" / "x86-64-v3.yaml"  # AVX2: runs on every x86 CPU these benches met
LOOP_JITTER = 1.1  # the agent's loop sleeps PERIOD x uniform(1.0, 1.1) between syncs
SYNC_ALLOWANCE_S = 90.0  # one sync that installs (download, reference check) on a loaded 2-core host
SCALE_LOCK = Path("/tmp/edgetune-bench-scale.lock")


@dataclass(frozen=True)
class Network:
    """Where a scale fleet lives: its name, bridge, subnet (the host is its first address) and
    the artifact server's port."""

    name: str
    bridge: str
    subnet: str  # e.g. 10.232.0.0/22
    deploy_port: int
    tracker_port: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def host(self) -> str:
        return str(self.network.network_address + 1)

    def board_address(self, index: int) -> str:
        """The index-th board's address: from the network's 11th address on, skipping the .0
        and .255 of every /24 inside it (valid in a /22, but confusing to read)."""
        offset, usable = 10, -1
        for address in self.network.hosts():
            if int(address) - int(self.network.network_address) < offset or str(address).endswith((".0", ".255")):
                continue
            usable += 1
            if usable == index:
                return str(address)
        raise SystemExit(f"{self.subnet} has no room for {index + 1} boards")


BENCH_NETWORK = Network("scale", "etune-scale", "10.232.0.0/22", deploy_port=8640, tracker_port=9590)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------- the fleet and its release


def board_names(boards: int) -> list[str]:
    width = max(3, len(str(boards)))
    return [f"b{n:0{width}d}" for n in range(1, boards + 1)]


def write_fleet_yaml(
    workdir: Path,
    net: Network,
    boards: int,
    python: Path,
    classes: int = 1,
    connect_timeout_s: float = 10,
    command_timeout_s: float = 300,
) -> Path:
    """fleet.yaml of a scale fleet in `workdir`: `boards` simulated boards (a full core's quota
    each, classes round-robin), their Python `python`, one model (mlp)."""
    import yaml

    class_names = [f"{net.name}-x86"] if classes == 1 else [f"{net.name}-x86-{chr(97 + n)}" for n in range(classes)]
    fleet = {
        "version": 1,
        "name": net.name,
        "workdir": "work",
        "sim": {"bridge": net.bridge, "host_address": f"{net.host}/{net.network.prefixlen}"},
        "trackers": [
            {
                "name": "host",
                "bind_host": net.host,
                "public_address": net.host,
                "port": net.tracker_port,
                "port_end": net.tracker_port + 9,
            }
        ],
        "ssh": {
            "user": "root",
            "key": "work/sim/id_ed25519",
            "known_hosts": "work/known_hosts",
            "connect_timeout_s": connect_timeout_s,
            "command_timeout_s": command_timeout_s,
        },
        "device_classes": [{"name": name, "profile": str(PROFILE)} for name in class_names],
        "boards": [
            {
                "name": name,
                "address": net.board_address(n),
                "device_class": class_names[n % classes],
                "python": str(python),
                "workdir": str(workdir / "work" / "boards" / name),
                "simulated": {"cpu_quota": 1.0},
            }
            for n, name in enumerate(board_names(boards))
        ],
        "models": [{"name": MODEL, "builtin": "mlp", "inputs": [{"name": "x", "shape": [1, 256], "dtype": "float32"}]}],
        "tuning": {"trials_per_class": 16},
        "artifacts": {
            "dir": "artifacts",
            "signing_key": "work/keys/signing.key",
            "public_key": "work/keys/signing.pub",
        },
        "deploy": {"bind": f"{net.host}:{net.deploy_port}", "url": f"https://{net.host}:{net.deploy_port}"},
    }
    path = workdir / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet, sort_keys=False))
    return path


def init_keys(fleet) -> None:
    """`edgetune keys init --if-missing`: signing key, decision key, fleet CA and server
    certificate, operator token."""
    import io

    from edgetune.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        if main(["keys", "init", "--if-missing", "-f", str(fleet.path)]) != 0:
            raise SystemExit("edgetune keys init failed")


def publish_mlp(fleet) -> dict[str, int]:
    """A signed version of mlp per class: the library compiled here untuned for the class's
    profile (as `edgetune build` builds its untuned twin), its reference input and expected
    output (the host's untuned run), a manifest with no board measurement. Per class, the
    version stored."""
    import importlib.metadata
    import shutil
    from datetime import datetime, timezone

    import tvm

    from edgetune import __version__
    from edgetune.artifact.release import profile_digest
    from edgetune.artifact.store import ArtifactStore
    from edgetune.artifact_format.codec import sha256_hex
    from edgetune.artifact_format.manifest import (
        EXPECTED_OUTPUT_NAME,
        LIBRARY_NAME,
        REFERENCE_INPUT_NAME,
        BuildInputs,
        Entry,
        Manifest,
        RecordHits,
        Reference,
        TuningStats,
    )
    from edgetune.artifact_format.reference import npz_bytes, output_tolerance
    from edgetune.artifact_format.signing import load_private_key
    from edgetune.compiler.models import (
        entry_function,
        import_model,
        model_interface,
        reference_inputs,
        reference_outputs,
        rounding_spread,
    )
    from edgetune.compiler.prepare import build_untuned, prepare
    from edgetune.compiler.target import build_target
    from edgetune.tune.candidate_builder import SharedLibraryExport

    model = next(m for m in fleet.models if m.name == MODEL)
    imported = import_model(model)
    ref_inputs = reference_inputs(model)
    fed = {i.name: ref_inputs[i.name] for i in model.fed_inputs}
    expected = {f"output{i}": out for i, out in enumerate(reference_outputs(model, ref_inputs))}
    store, key = ArtifactStore(fleet.artifacts.dir), load_private_key(fleet.artifacts.signing_key)
    versions = {}
    with tempfile.TemporaryDirectory(prefix="edgetune-scale-build-") as work:
        for device_class in fleet.device_classes:
            profile = device_class.profile
            target = build_target(profile)
            library = SharedLibraryExport(work, profile.cross_compiler)(
                build_untuned(prepare(imported.mod, target), target)
            )
            inputs = BuildInputs(
                model=model.name,
                model_source_sha256=sha256_hex(tvm.ir.save_json(imported.mod).encode("utf-8")),
                device_class=device_class.name,
                profile_sha256=profile_digest(profile),
                target=profile.target_json(),
                tvm_version=importlib.metadata.version("apache-tvm"),
                tvm_ffi_version=importlib.metadata.version("apache-tvm-ffi"),
                database_sha256=sha256_hex(b"untuned: no database"),
                reference_input_sha256=sha256_hex(npz_bytes(fed)),
                tolerance=output_tolerance(rounding_spread(model, ref_inputs)),
                edgetune_version=__version__,
            )
            manifest = Manifest.create(
                version=0,
                created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                inputs=inputs,
                entry=Entry(function=entry_function(imported.mod), inputs=tuple(fed)),
                interface=model_interface(imported.mod, tuple(fed)),
                files=(),
                tuning=TuningStats(trials=0, tuning_time_s=0.0),
                record_hits=RecordHits(tasks_with_record=0, tasks_without_record=()),
                reference=Reference(source="tvm-untuned-host", output_sha256=sha256_hex(npz_bytes(expected))),
                boards=(),
            )
            with store.stage(model.name, device_class.name) as staging:
                shutil.copyfile(library, staging.path / LIBRARY_NAME)
                (staging.path / REFERENCE_INPUT_NAME).write_bytes(npz_bytes(fed))
                (staging.path / EXPECTED_OUTPUT_NAME).write_bytes(npz_bytes(expected))
                versions[device_class.name] = store.commit(staging, manifest, key).stored.version
    return versions


# ---------------------------------------------------------------- the artifact server as a process


class ServerProcess:
    """`edgetune serve -f FLEET` as a child process: its access log (one JSON line per request)
    in a file, its RSS sampled every 0.2 s (and VmHWM, the kernel's peak), its CPU seconds."""

    def __init__(self, fleet, log_path: Path):
        from edgetune.deploy.rollout import check_server

        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgetune", "serve", "-f", str(fleet.path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        self.rss_samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"edgetune serve exited ({self.process.returncode}): {log_path.read_text()[-2000:]}")
            try:
                check_server(fleet)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _status(self) -> dict[str, int]:
        found = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) * 1024
        return found

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            rss = self._status().get("VmRSS")
            if rss is not None:
                self.rss_samples.append((time.monotonic(), rss))

    def peak_rss(self, since: float = 0.0) -> int:
        return max((rss for t, rss in self.rss_samples if t >= since), default=0)

    def hwm(self) -> int:
        return self._status().get("VmHWM", 0)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def access_lines(self) -> list[dict]:
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if "path" in record and "status" in record:
                        lines.append(record)
        return lines

    def stop(self) -> None:
        self._stop.set()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


# ---------------------------------------------------------------- measuring the library's steps


@dataclass
class Span:
    kind: str
    board: str | None
    start: float
    seconds: float
    ok: bool
    detail: str = ""


class Probe:
    """Wraps the rollout's steps (module attributes of edgetune, put back on exit) to time them
    per board: nothing in edgetune is changed, its calls are only timed."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._patched: list[tuple[object, str, object]] = []

    def _add(self, span: Span) -> None:
        with self._lock:
            self.spans.append(span)

    def wrap(
        self,
        owner,
        name: str,
        kind: str,
        board_of: Callable = lambda *a, **k: None,
        detail_of: Callable = lambda result: "",
    ) -> None:
        original = getattr(owner, name)
        probe = self

        def timed(*args, **kwargs):
            started = time.monotonic()
            ok, detail = False, ""
            try:
                result = original(*args, **kwargs)
                ok, detail = True, detail_of(result)
                return result
            finally:
                try:
                    board = board_of(*args, **kwargs)
                except Exception:
                    board = None
                probe._add(Span(kind, board, started, time.monotonic() - started, ok, detail))

        timed.__wrapped__ = original
        self._patched.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self) -> Probe:
        from edgetune.deploy import remote, rollout
        from edgetune.deploy.remote import RemoteAgent
        from edgetune.deploy.rollout_journal import RolloutJournal
        from edgetune.fleet import ssh, state

        self.wrap(ssh, "_connect", "ssh connect", lambda board: board.name)
        self.wrap(RemoteAgent, "provision", "provision", lambda agent, *a: agent.board.name)
        self.wrap(remote, "ensure_bundle", "bundle check", lambda session: session.board.name)
        self.wrap(RemoteAgent, "status", "agent status", lambda agent: agent.board.name)
        self.wrap(
            RemoteAgent,
            "change",
            "agent install",
            lambda agent, verb, *a, **k: agent.board.name,
            lambda record: record.result,
        )
        self.wrap(
            rollout,
            "_install",
            "board (whole)",
            lambda fleet, plan, target, *a: target.board.name,
            lambda outcome: outcome.result,
        )
        self.wrap(rollout, "read_back", "read-back", lambda fleet, board, model: board.name)
        self.wrap(rollout, "_run_stage", "stage", lambda fleet, plan, stage, *a: f"{stage.name} [{len(stage.targets)}]")
        self.wrap(rollout, "_record_what_boards_run", "final read-back")
        self.wrap(rollout, "_unassign", "unassign (stage)", lambda fleet, plan, targets, before: str(len(targets)))
        self.wrap(state, "_record", "state write", lambda fleet, kind, *a: kind.FILE)
        self.wrap(RolloutJournal, "_write", "journal write")
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()

    def __getstate__(self) -> dict:
        return {"spans": self.spans}

    def __setstate__(self, state: dict) -> None:
        self.spans, self._lock, self._patched = state["spans"], threading.Lock(), []

    def of(self, kind: str, ok: bool | None = None) -> list[Span]:
        return [s for s in self.spans if s.kind == kind and (ok is None or s.ok == ok)]


# ---------------------------------------------------------------- CPU accounting


def _proc_cpu(pid: int, children: bool = True) -> float:
    """CPU seconds of a process (and of the children it reaped); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def boards_cpu_seconds(fleet) -> float:
    """CPU seconds the boards spent: each board's sshd with every session it reaped (the agent's
    runs over SSH), plus each board's timer loop with the syncs and reference checks it ran."""
    from edgetune.fleet.agent_bundle import agent_root
    from edgetune.fleet.state import load_sim_pids

    total = sum(_proc_cpu(pid) for pid in load_sim_pids(fleet).values())
    for board in fleet.boards:
        with contextlib.suppress(OSError, ValueError):
            total += _proc_cpu(int(Path(agent_root(board), "sync-loop.pid").read_text()))
    return total


def timer_loop_rss(fleet) -> list[int]:
    """The resident memory of each board's timer loop (the agent's `sync --every`), bytes."""
    from edgetune.fleet.agent_bundle import agent_root

    found = []
    for board in fleet.boards:
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(agent_root(board), "sync-loop.pid").read_text())
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    found.append(int(line.split()[1]) * 1024)
    return found


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_seconds() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@dataclass
class CpuMark:
    wall: float
    rollout: float
    server: float
    boards: float
    machine: float

    @classmethod
    def now(cls, fleet, server: ServerProcess) -> CpuMark:
        return cls(
            time.monotonic(),
            self_cpu_seconds(),
            server.cpu_seconds(),
            boards_cpu_seconds(fleet),
            machine_busy_seconds(),
        )

    def since(self, earlier: CpuMark) -> CpuMark:
        return CpuMark(
            *(getattr(self, f) - getattr(earlier, f) for f in ("wall", "rollout", "server", "boards", "machine"))
        )


# ---------------------------------------------------------------- links


def set_links(fleet, names: Sequence[str], up: bool) -> None:
    """`ip -n NS link set eth0 up|down` for each board (as tests/support/sim_checks.py's link_down)."""
    from edgetune.fleet.sim import plan_sim

    netns = {s.board.name: s.netns for s in plan_sim(fleet)}
    for name in names:
        subprocess.run(["ip", "-n", netns[name], "link", "set", "eth0", "up" if up else "down"], check=True)


def offline_boards(fleet, pct: float) -> list[str]:
    """Every k-th board (k = 100 / pct), the first one included: round(n x pct / 100) boards."""
    names = [b.name for b in fleet.boards]
    count = round(len(names) * pct / 100)
    if count == 0:
        return []
    step = len(names) / count
    return [names[int(i * step)] for i in range(count)]


# ---------------------------------------------------------------- the scenario


@dataclass
class ScaleRun:
    """Everything one run measured; `report()` prints it."""

    fleet: object
    parallel: int
    period_s: float
    timers_on: str
    offline: list[str]
    versions: dict[str, int]
    setup_s: dict[str, float] = field(default_factory=dict)
    result: object = None  # the RolloutResult
    rollout_cpu: CpuMark | None = None
    probe: Probe | None = None
    rollout_lines: list[dict] = field(default_factory=list)
    idle_lines: list[dict] = field(default_factory=list)
    idle_s: float = 0.0
    idle_cpu: CpuMark | None = None  # the timers' own load, before the rollout
    catch_up: dict[str, float | None] = field(
        default_factory=dict
    )  # pending board -> s after links up (None: not within the bound)
    catch_up_bound_s: float = 0.0
    catch_up_cpu: CpuMark | None = None
    catch_up_lines: list[dict] = field(default_factory=list)
    server_peak_rss: int = 0
    server_rss_at_start: int = 0
    server_hwm: int = 0
    state_costs: dict[int, dict[str, float]] = field(default_factory=dict)
    loop_rss: list[int] = field(default_factory=list)  # each timer loop's resident memory, bytes
    commit: str = ""
    load_at_start: str = ""
    load_at_end: str = ""
    reported_at_end: dict[str, int | None] = field(default_factory=dict)  # board -> the version its last report names

    @property
    def boards(self) -> int:
        return len(self.fleet.boards)

    def runs_version(self, name: str) -> bool:
        board = self.fleet.board(name)
        record = next(r for r in self.result.records() if r["board"] == name)
        return record["runs"] == self.versions[board.device_class]


def catch_up_bound_s(period_s: float) -> float:
    """How long after its link is back a board's timer may take to install and report: its loop
    sleeps up to LOOP_JITTER x the period between syncs, then one sync that installs."""
    return LOOP_JITTER * period_s + SYNC_ALLOWANCE_S


@contextlib.contextmanager
def scale_fleet(fleet, run: ScaleRun) -> Iterator[ServerProcess]:
    """The simulated fleet up, keys, mlp published and the server up for the block; whatever
    happens after, links back up, timers removed, server stopped, fleet down."""
    from edgetune.deploy.pull_timer import remove_timers
    from edgetune.fleet import sim_down, sim_up

    server = None
    try:
        started = time.monotonic()
        init_keys(fleet)
        run.versions = publish_mlp(fleet)
        run.setup_s["keys + mlp compiled and published"] = time.monotonic() - started
        say(f"published {MODEL} " + ", ".join(f"v{v} for {c}" for c, v in run.versions.items()))
        started = time.monotonic()
        simulated = sim_up(fleet)
        run.setup_s["sim up"] = time.monotonic() - started
        if not simulated.ok:
            raise SystemExit(f"sim up failed for {len(simulated.failed)} boards: {list(simulated.failed.values())[:5]}")
        say(f"sim up: {len(simulated.succeeded)} boards in {run.setup_s['sim up']:.1f} s")
        started = time.monotonic()
        server = ServerProcess(fleet, Path(fleet.workdir) / "serve.log")
        run.setup_s["server up"] = time.monotonic() - started
        yield server
    finally:
        say("cleaning up: links up, timers removed, server stopped, sim down")
        with contextlib.suppress(Exception):
            set_links(fleet, run.offline, up=True)
        try:
            removed = remove_timers(fleet, fleet.boards)
            if not removed.ok:
                say(
                    f"  timers not removed on {len(removed.failed)} boards (sim down stops their loops): "
                    f"{list(removed.failed.values())[:3]}"
                )
        except Exception as err:  # noqa: BLE001 - clean-up goes on
            say(f"  removing timers: {err}")
        if server is not None:
            server.stop()
        down = sim_down(fleet)
        if not down.ok:  # the kernel may still be removing a veth: sim_down is idempotent
            time.sleep(1.0)
            down = sim_down(fleet)
            if not down.ok:
                say(f"WARNING: sim down left something: {list(down.failed.values())[:5]}")


def run_scale(
    fleet,
    parallel: int | None = None,
    offline_pct: float = 10.0,
    period_s: float = 10.0,
    timers_on: str = "all",
    idle_window_s: float | None = None,
) -> ScaleRun:
    """The whole scenario on `fleet` (a scale fleet's loaded fleet.yaml, nothing started):
    returns what it measured; everything it started is stopped before it returns or raises."""
    from edgetune.deploy.pull_timer import install_timers
    from edgetune.deploy.rollout import plan_rollout, rollout
    from edgetune.fleet.state import load_reported

    run = ScaleRun(fleet, parallel, period_s, timers_on, offline_boards(fleet, offline_pct), {})
    run.commit, run.load_at_start = commit(), load_average()
    with scale_fleet(fleet, run) as server:
        run.server_rss_at_start = server._status().get("VmRSS", 0)
        timed_boards = fleet.boards if timers_on == "all" else [fleet.board(name) for name in run.offline]
        started = time.monotonic()
        timers = install_timers(fleet, timed_boards, period_s)
        run.setup_s[f"timers installed ({len(timed_boards)} boards)"] = time.monotonic() - started
        if not timers.ok:
            raise SystemExit(f"timer install failed on {len(timers.failed)} boards: {list(timers.failed.values())[:5]}")
        say(
            f"timers ({', '.join(sorted(set(timers.succeeded.values())))}, every {period_s:g} s) on {len(timers.succeeded)} "
            f"boards in {run.setup_s[f'timers installed ({len(timed_boards)} boards)']:.1f} s"
        )

        # the server's load from the timers alone: every board reported once, then a quiet window
        timed_names = {b.name for b in timed_boards}
        if not _wait(lambda: timed_names <= set(load_reported(fleet)), catch_up_bound_s(period_s)):
            say(f"  not every timed board reported within {catch_up_bound_s(period_s):g} s")
        run.loop_rss = timer_loop_rss(fleet)
        window = idle_window_s if idle_window_s is not None else 2 * LOOP_JITTER * period_s
        before = len(server.access_lines())
        mark = CpuMark.now(fleet, server)
        time.sleep(window)
        run.idle_cpu = CpuMark.now(fleet, server).since(mark)
        run.idle_lines, run.idle_s = server.access_lines()[before:], window

        set_links(fleet, run.offline, up=False)
        say(
            f"links down: {len(run.offline)} boards ({', '.join(run.offline[:8])}{' ...' if len(run.offline) > 8 else ''})"
        )
        plan = plan_rollout(fleet, MODEL, parallel=parallel)
        run.parallel = plan.parallel
        say(
            f"rollout of {MODEL} to {run.boards} boards, parallel {plan.parallel}: "
            + ", ".join(f"{s.name} ({len(s.targets)})" for s in plan.stages)
        )
        before = len(server.access_lines())
        rss_since = time.monotonic()
        mark = CpuMark.now(fleet, server)
        with Probe() as probe:
            run.result = rollout(fleet, plan)
        run.rollout_cpu = CpuMark.now(fleet, server).since(mark)
        run.probe = probe
        run.rollout_lines = server.access_lines()[before:]
        run.server_peak_rss = server.peak_rss(rss_since)
        pending = run.result.pending
        say(
            f"rollout done in {run.rollout_cpu.wall:.1f} s: ok {run.result.ok}, stopped {run.result.stopped}, "
            f"{len(pending)} pending"
        )

        set_links(fleet, run.offline, up=True)
        back = time.monotonic()
        mark = CpuMark.now(fleet, server)
        before = len(server.access_lines())
        run.catch_up_bound_s = catch_up_bound_s(period_s)
        waiting = {name for name in pending}
        run.catch_up = {name: None for name in pending}
        while waiting and time.monotonic() - back < run.catch_up_bound_s:
            reported = load_reported(fleet)
            for name in sorted(waiting):
                report = reported.get(name)
                if report is not None and report.models.get(MODEL) == run.versions[fleet.board(name).device_class]:
                    run.catch_up[name] = time.monotonic() - back
                    waiting.discard(name)
            time.sleep(0.25)
        run.catch_up_cpu = CpuMark.now(fleet, server).since(mark)
        # every timed board (not only the pending ones) reports the version within the same bound
        wanted = {name: run.versions[fleet.board(name).device_class] for name in timed_names}
        _wait(
            lambda: all(getattr(load_reported(fleet).get(n), "models", {}).get(MODEL) == v for n, v in wanted.items()),
            max(0.0, run.catch_up_bound_s - (time.monotonic() - back)),
        )
        run.reported_at_end = {name: report.models.get(MODEL) for name, report in sorted(load_reported(fleet).items())}
        run.catch_up_lines = server.access_lines()[before:]
        say(
            f"after the links came back: {len(pending) - len(waiting)} of {len(pending)} pending boards reported "
            f"v1 within {run.catch_up_cpu.wall:.1f} s"
        )
        run.server_peak_rss = max(run.server_peak_rss, server.peak_rss(rss_since))
        run.server_hwm = server.hwm()
        run.load_at_end = load_average()
    return run


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


# ---------------------------------------------------------------- one state write at N and at 10,000 boards


def state_costs(fleet, sizes: Sequence[int], repeats: int = 10) -> dict[int, dict[str, float]]:
    """Seconds of one call, on files holding `size` boards (in a scratch copy of the workdir):
    record_assigned and record_deployed (a rollout's per-board writes), load_assigned (each
    timer's GET /assigned on the server), record_reported (each timer's POST /status), one write
    of the intent journal, and paramiko's parse of a known_hosts of `size` lines (every SSH
    connect reads it)."""
    key_part = Path(fleet.boards[0].ssh.known_hosts).read_text().splitlines()[0].split(" ", 1)[1]
    return {size: _costs_at(fleet, size, key_part, repeats) for size in sizes}


def _costs_at(fleet, size: int, key_part: str, repeats: int) -> dict[str, float]:
    """`state_costs` at one size."""
    import paramiko

    from edgetune.artifact_format.codec import FrozenMap
    from edgetune.deploy.rollout_journal import RolloutJournal
    from edgetune.fleet.state import (
        AssignedState,
        BoardReport,
        DeployedState,
        ReportedState,
        load_assigned,
        record_assigned,
        record_deployed,
        record_reported,
        write_state,
    )

    with tempfile.TemporaryDirectory(prefix="edgetune-scale-state-") as scratch:
        scratch_fleet = fleet.replace(workdir=Path(scratch))
        names = [f"x{n:05d}" for n in range(size)]
        write_state(scratch_fleet, AssignedState(FrozenMap({n: FrozenMap({MODEL: 1}) for n in names})))
        write_state(scratch_fleet, DeployedState(FrozenMap({n: FrozenMap({MODEL: 1}) for n in names})))
        report = BoardReport("2026-12-05T00:00:00+00:00", "sim-firmware 1", FrozenMap({MODEL: 1}), FrozenMap())
        write_state(scratch_fleet, ReportedState(FrozenMap({n: report for n in names})))
        found: dict[str, float] = {}
        found["record_assigned"] = _per_call(
            lambda i: record_assigned(scratch_fleet, names[i % size], MODEL, 2), repeats
        )
        found["record_deployed"] = _per_call(
            lambda i: record_deployed(scratch_fleet, names[i % size], MODEL, 2), repeats
        )
        found["load_assigned (server, per GET)"] = _per_call(lambda i: load_assigned(scratch_fleet), repeats)
        found["record_reported (server, per POST)"] = _per_call(
            lambda i: record_reported(scratch_fleet, names[i % size], report), repeats
        )
        with RolloutJournal.held(scratch_fleet, MODEL) as journal:
            journal.plan_stage("batch 1", dict.fromkeys(names, 2))
            found["journal write"] = _per_call(lambda i: journal._write(), repeats)
        hosts = Path(scratch) / "known_hosts"
        hosts.write_text("".join(f"10.{n // 65536 % 256}.{n // 256 % 256}.{n % 256} {key_part}\n" for n in range(size)))
        found["known_hosts parse (per SSH connect)"] = _per_call(lambda i: paramiko.HostKeys(str(hosts)), repeats)
    return found


def _per_call(call: Callable[[int], object], repeats: int, budget_s: float = 2.0) -> float:
    """The median seconds of `call` over up to `repeats` calls, fewer once `budget_s` is spent
    (a known_hosts of 10,000 lines takes tens of seconds to parse)."""
    times = []
    for i in range(repeats):
        started = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - started)
        if sum(times) > budget_s:
            break
    return statistics.median(times)


# ---------------------------------------------------------------- the report


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return f"{statistics.median(ordered):.2f} / {p95:.2f} / {max(ordered):.2f}"


def _rate(lines: list[dict], seconds: float) -> str:
    return f"{len(lines)} ({len(lines) / seconds:.1f}/s)" if seconds > 0 else str(len(lines))


def _route(path: str) -> str:
    return (
        "tarball"
        if path.endswith(".tar.gz")
        else "manifest"
        if "/artifacts/" in path
        else "assigned"
        if path.endswith("/assigned")
        else "status (POST)"
        if path.endswith("/status")
        else "offer"
        if "/models/" in path
        else path
    )


def _by_route(lines: list[dict]) -> dict[str, int]:
    routes: dict[str, int] = {}
    for line in lines:
        routes[_route(line["path"])] = routes.get(_route(line["path"]), 0) + 1
    return routes


def _ms_by_route(lines: list[dict]) -> dict[str, list[float]]:
    routes: dict[str, list[float]] = {}
    for line in lines:
        routes.setdefault(_route(line["path"]), []).append(line["ms"])
    return routes


@dataclass(frozen=True)
class Estimate:
    parts: dict[str, float]  # what bounds the time, seconds each
    serial: dict[str, float]  # added to the largest part (serialized work under one lock)
    total_s: float
    bound_by: str


def extrapolate(run: ScaleRun, boards: int, parallel: int | None = None) -> Estimate:
    """The rollout's time at `boards` boards, were each board a real machine (its own CPU):
    - the boards' side: ceil(boards / parallel) rounds of one board's install as the canary
      took it alone (SSH, provisioning, status, install with its reference check, read-back);
    - this host's rollout process: its CPU seconds per reached board (SSH handshakes, paramiko,
      JSON), at most one core (Python threads share one interpreter lock);
    - the server: its CPU seconds per board (TLS, offers, tarballs), one core (one process);
    - serialized writes: per board, as many state and journal writes as measured here, each
      costing what one costs on a file of `boards` boards (state_costs), plus the known_hosts
      parse of each SSH connect at that size: these run under one lock or the interpreter lock,
      so they add up whatever --parallel is.
    The estimate is the largest of the first three plus the serialized writes."""
    result, probe, cpu = run.result, run.probe, run.rollout_cpu
    parallel = parallel or run.parallel
    reached = [o for o in result.outcomes if o.result != "pending"] or list(result.outcomes)
    alone = [s for s in probe.of("board (whole)") if s.detail in ("installed", "unchanged")][:1]  # the canary
    read_backs = {s.board: s.seconds for s in probe.of("read-back")}
    if alone:
        per_board = alone[0].seconds + read_backs.get(alone[0].board, 0.0)
    else:
        per_board = statistics.median(s.seconds for s in probe.of("board (whole)"))
    # the timers' own load on the server while the rollout ran: that of the timed boards whose link was up
    timed = run.boards if run.timers_on == "all" else len(run.offline)
    online_timed = timed - len(run.offline)
    background = (
        run.idle_cpu.server / run.idle_cpu.wall * cpu.wall * online_timed / timed
        if run.idle_cpu and run.idle_cpu.wall > 0 and timed
        else 0.0
    )
    server_per_board = max(0.0, cpu.server - background) / len(reached)
    parts = {
        f"boards: ceil(N/{parallel}) x one board alone ({per_board:.2f} s)": math.ceil(boards / parallel) * per_board,
        f"rollout process CPU: {cpu.rollout / len(reached) * 1e3:.0f} ms/board": boards * cpu.rollout / len(reached),
        f"server CPU: {server_per_board * 1e3:.0f} ms/board (the timers' own load taken out)": boards
        * server_per_board,
    }
    costs = run.state_costs.get(boards) or {}
    serial = {}
    if costs:
        state_writes = len(probe.of("state write")) / len(reached)
        journal_writes = len(probe.of("journal write")) / len(reached)
        connects = len(probe.of("ssh connect")) / len(result.outcomes)
        state_write = (costs["record_assigned"] + costs["record_deployed"]) / 2
        journal_write = costs["journal write"]
        parse = costs["known_hosts parse (per SSH connect)"]
        serial[f"state writes: {state_writes:.1f}/board x {state_write * 1e3:.1f} ms"] = (
            boards * state_writes * state_write
        )
        serial[f"journal writes: {journal_writes:.1f}/board x {journal_write * 1e3:.1f} ms"] = (
            boards * journal_writes * journal_write
        )
        serial[f"known_hosts parse: {connects:.1f} connects/board x {parse * 1e3:.1f} ms"] = boards * connects * parse
    largest = max(parts, key=parts.get)
    total = parts[largest] + sum(serial.values())
    candidates = {largest: parts[largest], **serial}
    return Estimate(parts, serial, total, max(candidates, key=candidates.get))


def report(run: ScaleRun, command: str, extrapolate_to: int) -> str:
    from tabulate import tabulate

    result, probe, cpu = run.result, run.probe, run.rollout_cpu
    counts: dict[str, int] = {}
    for outcome in result.outcomes:
        counts[outcome.result] = counts.get(outcome.result, 0) + 1
    pending = set(result.pending)
    on_version = [o.board for o in result.outcomes if o.board not in pending and run.runs_version(o.board)]
    out = []
    out.append(
        f"{run.boards} simulated boards ({len(run.fleet.device_classes)} class), {len(run.offline)} offline "
        f"({len(run.offline) / run.boards:.0%}), parallel {run.parallel}, timers on {run.timers_on} boards "
        f"every {run.period_s:g} s"
    )
    out.append("")
    rows = [[step, f"{seconds:.1f} s"] for step, seconds in run.setup_s.items()]
    out.append(tabulate(rows, headers=["set-up", "wall"], tablefmt="github"))
    out.append("")
    stage_rows = [
        [s.board, f"{s.seconds:.1f} s", f"{s.seconds / max(1, int(s.board.rsplit('[', 1)[1][:-1])):.2f} s"]
        for s in probe.of("stage")
    ]
    final = probe.of("final read-back")
    stage_rows.append(
        [
            "final read-back (reached boards)",
            f"{sum(s.seconds for s in final):.1f} s",
            f"{sum(s.seconds for s in final) / max(1, len(result.outcomes) - len(pending)):.2f} s",
        ]
    )
    stage_rows.append(["rollout (total)", f"{cpu.wall:.1f} s", f"{cpu.wall / run.boards:.2f} s"])
    out.append(tabulate(stage_rows, headers=["stage [boards]", "wall", "wall / board"], tablefmt="github"))
    out.append("")
    step_rows = []
    for kind_name in (
        "ssh connect",
        "provision",
        "bundle check",
        "agent status",
        "agent install",
        "read-back",
        "board (whole)",
        "assign (stage)",
        "unassign (stage)",
        "state write",
        "journal write",
    ):
        spans = probe.of(kind_name)
        if not spans:
            continue
        ok = [s.seconds for s in spans if s.ok]
        step_rows.append(
            [kind_name, len(spans), len(spans) - len(ok), _stats(ok), f"{sum(s.seconds for s in spans):.1f}"]
        )
    out.append(
        tabulate(
            step_rows,
            headers=["step (per call)", "calls", "failed", "median / p95 / max s", "sum s"],
            tablefmt="github",
        )
    )
    installs = probe.of("agent install", ok=True)
    by_result: dict[str, list[float]] = {}
    for span in installs:
        by_result.setdefault(span.detail, []).append(span.seconds)
    if by_result:
        out.append(
            "agent install by its result: "
            + "; ".join(f"{r}: {len(v)}, median {statistics.median(v):.2f} s" for r, v in sorted(by_result.items()))
        )
    out.append("")
    served = len(run.rollout_lines)
    rows = [
        [
            "outcomes",
            ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; ok {result.ok}, stopped {result.stopped}",
        ],
        [
            "pending == taken offline",
            f"{sorted(pending) == sorted(run.offline)} ({len(pending)} pending, {len(run.offline)} offline)",
        ],
        [
            "reached boards on v1 (read back)",
            f"{len(on_version)} of {run.boards - len(pending)}"
            + (
                " although the rollout stopped: those a timer switched before the rollout's own "
                "install read them were taken to run v1 already, and not rolled back"
                if result.stopped and on_version
                else ""
            ),
        ],
        ["rollout wall / per board", f"{cpu.wall:.1f} s / {cpu.wall / run.boards:.2f} s"],
        [
            "CPU s during the rollout",
            f"rollout process {cpu.rollout:.1f}, server {cpu.server:.1f}, boards {cpu.boards:.1f}, "
            f"whole machine {cpu.machine:.1f} ({cpu.machine / cpu.wall:.2f} cores busy)",
        ],
        [
            "server requests, rollout",
            f"{_rate(run.rollout_lines, cpu.wall)}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(_by_route(run.rollout_lines).items())),
        ],
        [
            "server requests, timers alone",
            f"{_rate(run.idle_lines, run.idle_s)} over {run.idle_s:.0f} s: "
            + ", ".join(f"{k} {v}" for k, v in sorted(_by_route(run.idle_lines).items()))
            + (
                f"; server CPU {run.idle_cpu.server / run.idle_cpu.wall:.2f} cores"
                if run.idle_cpu and run.idle_cpu.wall
                else ""
            ),
        ],
        [
            "server mean ms per request (its log)",
            f"rollout {statistics.fmean([line['ms'] for line in run.rollout_lines]) if served else 0:.1f}, "
            f"catch-up {statistics.fmean([line['ms'] for line in run.catch_up_lines]) if run.catch_up_lines else 0:.1f}",
        ],
        [
            "server ms per request by route, rollout (median)",
            ", ".join(
                f"{route} {statistics.median(ms):.0f}" for route, ms in sorted(_ms_by_route(run.rollout_lines).items())
            ),
        ],
        [
            "server errors (status >= 400)",
            str(sum(line["status"] >= 400 for line in run.rollout_lines + run.catch_up_lines + run.idle_lines)),
        ],
        [
            "server RSS",
            f"{run.server_rss_at_start / 2**20:.0f} MiB at start, peak {run.server_peak_rss / 2**20:.0f} MiB sampled, "
            f"VmHWM {run.server_hwm / 2**20:.0f} MiB",
        ],
    ]
    if run.loop_rss:
        rows.append(
            [
                "timer loops' RSS (agent `sync --every`)",
                f"median {statistics.median(run.loop_rss) / 2**20:.0f} MiB per board, "
                f"{sum(run.loop_rss) / 2**30:.2f} GiB for {len(run.loop_rss)}",
            ]
        )
    caught = [t for t in run.catch_up.values() if t is not None]
    rows.append(
        [
            "pending boards caught up by their timer",
            f"{len(caught)} of {len(run.catch_up)} within the bound {run.catch_up_bound_s:.0f} s"
            + (
                f"; all by {max(caught):.1f} s (median {statistics.median(caught):.1f} s) after the links came back"
                if caught
                else ""
            ),
        ]
    )
    if run.catch_up_cpu is not None:
        rows.append(["server requests, catch-up", f"{_rate(run.catch_up_lines, run.catch_up_cpu.wall)}"])
    out.append(tabulate(rows, headers=["", ""], tablefmt="github"))
    if run.state_costs:
        out.append("")
        sizes = sorted(run.state_costs)
        kinds = list(run.state_costs[sizes[0]])
        rows = [[k, *(f"{run.state_costs[n][k] * 1e3:.2f}" for n in sizes)] for k in kinds]
        out.append(
            tabulate(rows, headers=["one call, ms, on files of", *(f"{n} boards" for n in sizes)], tablefmt="github")
        )
        widths = [run.parallel]
        sized = getattr(run.fleet.deploy, "parallel_for", None)
        if sized is not None and sized(extrapolate_to) not in widths:
            widths.append(sized(extrapolate_to))  # the default width of a rollout of that many boards
        for width in widths:
            estimate = extrapolate(run, extrapolate_to, width)
            out.append("")
            out.append(f"estimate for {extrapolate_to} boards (each board its own CPU; parallel {width}):")
            for name, seconds in estimate.parts.items():
                out.append(f"  {name}: {seconds / 60:.1f} min")
            for name, seconds in estimate.serial.items():
                out.append(f"  + serialized {name}: {seconds / 60:.1f} min")
            out.append(f"  => about {estimate.total_s / 60:.0f} min; bound by: {estimate.bound_by}")
            without = estimate.total_s - sum(estimate.serial.values())
            out.append(
                f"  without the serialized writes and parses (were they O(1) per board): about {without / 60:.0f} min, "
                f"bound by: {max(estimate.parts, key=estimate.parts.get)}"
            )
        costs = run.state_costs.get(extrapolate_to)
        if costs:
            per_sync = costs["load_assigned (server, per GET)"] + costs["record_reported (server, per POST)"]
            for period in (run.period_s, 300.0):
                load = extrapolate_to / period * per_sync
                out.append(
                    f"  the server's state work for {extrapolate_to} timers every {period:g} s: {extrapolate_to / period:.1f} "
                    f"syncs/s x {per_sync * 1e3:.0f} ms (GET assigned + POST status at that size) = {load:.2f} cores"
                    + (" (more than the one core a server process has: the reports queue up)" if load > 1 else "")
                )
    out.append("")
    out.append(
        f"CPU: {cpu_model()}; {os.cpu_count()} cores; load average {run.load_at_start} before the fleet, "
        f"{run.load_at_end} after the catch-up"
    )
    out.append(f"commit {run.commit}; command: {command}")
    return "\n".join(out)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cpu_model() -> str:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def commit() -> str:
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return done.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def scale_lock(net: Network) -> Iterator[None]:
    """This bench's own lock, and a refusal to start over a bridge a killed run left."""
    with open(SCALE_LOCK, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"another scale bench holds {SCALE_LOCK}")
        if Path(f"/sys/class/net/{net.bridge}").exists():
            sys.exit(
                f"interface {net.bridge} exists but no scale bench runs: a killed run left its fleet; remove it with "
                "`.venv/bin/python -m edgetune sim down -f WORKDIR/fleet.yaml` (WORKDIR is printed at the start of a run)"
            )
        yield


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", type=int, default=200)
    parser.add_argument("--offline-pct", type=float, default=10.0, help="boards whose link is down during the rollout")
    parser.add_argument(
        "--parallel",
        type=int,
        help="boards installed at once (default: the fleet's deploy.parallel, else sized to the fleet)",
    )
    parser.add_argument("--period", type=float, default=10.0, help="the pull timers' period, seconds")
    parser.add_argument(
        "--timers",
        choices=("all", "offline"),
        default="all",
        help="timers on every board (default) or only on those taken offline",
    )
    parser.add_argument("--classes", type=int, default=1, help="device classes (boards round-robin; one canary each)")
    parser.add_argument("--extrapolate-to", type=int, default=10_000)
    parser.add_argument("--keep-workdir", action="store_true")
    parser.add_argument("--save-run", type=Path, help="also pickle what was measured to this file")
    parser.add_argument("--report-from", type=Path, help="print the report of a run saved with --save-run; run nothing")
    args = parser.parse_args()
    if args.report_from:
        import pickle

        saved = pickle.loads(args.report_from.read_bytes())
        print(report(saved["run"], saved["command"], args.extrapolate_to))
        return
    if not 1 <= args.boards <= 1000:
        parser.error("--boards: 1 to 1000 (a Linux bridge takes at most 1024 ports)")
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/scale_rollout.py", *sys.argv[1:]])
    _raise_open_files()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))

    from _benchlib import bench_lock
    from support.board_image import board_image

    from edgetune.inventory import load_fleet

    started = time.monotonic()
    with bench_lock(), scale_lock(BENCH_NETWORK):
        workdir = Path(tempfile.mkdtemp(prefix="edgetune-scale-"))
        say(
            f"workdir {workdir}; CPU {cpu_model()}, load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
        )
        try:
            image = board_image()
            say(f"board image {image}")
            fleet = load_fleet(
                write_fleet_yaml(workdir, BENCH_NETWORK, args.boards, image / "bin" / "python", args.classes)
            )
            run = run_scale(fleet, args.parallel, args.offline_pct, args.period, args.timers)
            say(
                f"measuring one state / journal write and a known_hosts parse at {args.boards}, 1000 and "
                f"{args.extrapolate_to} boards"
            )
            run.state_costs = state_costs(fleet, sorted({args.boards, 1000, args.extrapolate_to}))
            if args.save_run:
                import pickle

                args.save_run.write_bytes(pickle.dumps({"run": run, "command": command}))
            print()
            print(report(run, command, args.extrapolate_to))
        finally:
            if args.keep_workdir:
                say(f"workdir kept: {workdir}")
            else:
                subprocess.run(["rm", "-rf", str(workdir)], check=False)
    say(f"bench finished in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
