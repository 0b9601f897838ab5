"""Does the artifact server keep serving boards while it is attacked? `edgetune serve` (a
process of its own, fleet.yaml's deploy section at its defaults) on loopback, and an attacker
process holding --idle idle TLS connections (handshake done, nothing sent; spread over
--idle-sources addresses 127.0.10.x, under the per-address limit, reconnecting whenever the
server closes one) and a slowloris from one address (127.0.11.1: --slowloris connections
dripping a header line a second, reconnecting when cut or refused). Rounds interleaved, quiet
then attacked then attacked then quiet ...: in each, a board's client (127.0.0.1, a new TLS
connection per request, as the agent) asks `/v1/health` --requests times and downloads a
--tarball-mb MB tarball --downloads times, a request every --interval s. Prints, per kind, the median and spread (min-max)
quiet and under attack, the ratio (median over rounds, 95 % bootstrap interval), the failures,
what the attacker held and had cut, the server's open descriptors, and its log's size.

Run: .venv/bin/python bench/server_under_attack.py [--rounds 6] [--idle 1000] [--max-connections N]
Host only (no simulated fleet): loopback, ~5 min on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "tests")]

from _benchlib import REPO, load_now, machine_facts, round_ratio

FLEET_YAML = """\
version: 1
name: bench-attack
workdir: work
trackers:
  - {{name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: 9499}}
ssh: {{user: root, key: id_ed25519, known_hosts: known_hosts}}
device_classes:
  - {{name: gw, profile: {repo}/device_profiles/x86-64-v3.yaml}}
boards:
  - {{name: board-1, address: 127.0.0.11, device_class: gw, python: /usr/bin/python3, workdir: /tmp/b1}}
models:
  - {{name: mlp, builtin: mlp, inputs: [{{name: x, shape: [1, 256]}}]}}
tuning: {{trials_per_class: 16}}
artifacts: {{dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}}
deploy: {{bind: "127.0.0.1:{port}", url: "https://127.0.0.1:{port}"}}
"""
IDLE_NET, SLOWLORIS_ADDRESS = "127.0.10", "127.0.11.1"
SETTLE_S = 3.0  # after an attacked round, for the server to close what the attacker dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each kind (quiet, attacked)")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--idle-sources", type=int, default=50)
    parser.add_argument("--slowloris", type=int, default=100)
    parser.add_argument("--requests", type=int, default=60, help="/v1/health requests per round")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.35,
        help="seconds between requests (a round outlasts "
        "deploy.header_timeout_s, so each attacked one sees every idle connection cut and reopened)",
    )
    parser.add_argument("--downloads", type=int, default=3, help="tarball downloads per round")
    parser.add_argument("--tarball-mb", type=float, default=4.0)
    parser.add_argument(
        "--max-connections",
        type=int,
        help="deploy.max_connections (default: the fleet's default); "
        "below the attack's connections, each new one closes the longest idle one",
    )
    parser.add_argument("--attacker", nargs=3, metavar=("HOST", "PORT", "CA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_open_files()
    if args.attacker:
        asyncio.run(_attacker(args, *args.attacker))
        return
    print(machine_facts())
    with tempfile.TemporaryDirectory(prefix="edgetune-attack-") as directory:
        _bench(args, Path(directory))
    print(load_now())


def _raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _bench(args, directory: Path) -> None:
    from support.deploy_support import publish_version
    from support.tests_samples import FAKE_PRIVATE_KEY

    from edgetune.deploy.tls import host_client_context
    from edgetune.deploy.tokens import ensure_token
    from edgetune.inventory import load_fleet

    (directory / "id_ed25519").write_text(FAKE_PRIVATE_KEY)
    (directory / "id_ed25519").chmod(0o600)
    port = _free_port()
    text = FLEET_YAML.format(repo=REPO, port=port)
    if args.max_connections:
        text = text.replace('"}\n', f'", max_connections: {args.max_connections}}}\n')
    (directory / "fleet.yaml").write_text(text)
    fleet = load_fleet(directory / "fleet.yaml")
    subprocess.run(
        [sys.executable, "-m", "edgetune", "keys", "init", "--if-missing", "-f", str(fleet.path)],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )
    version = publish_version(fleet, "mlp", "gw", random.Random(0).randbytes(int(args.tarball_mb * 1e6)))
    token = ensure_token(fleet, fleet.board("board-1"))
    context = host_client_context(fleet)
    settings = fleet.deploy
    print(
        f"deploy limits: max_connections {settings.max_connections}, per client {settings.max_connections_per_client}, "
        f"header_timeout_s {settings.header_timeout_s:g}, keepalive_timeout_s {settings.keepalive_timeout_s:g}; "
        f"attack: {args.idle} idle TLS connections from {args.idle_sources} addresses, a slowloris of "
        f"{args.slowloris} connections from one; tarball {version.tarball.stat().st_size / 1e6:.1f} MB"
    )

    log = directory / "serve.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [sys.executable, "-m", "edgetune", "serve", "-f", str(fleet.path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    attacker = None
    try:
        base = f"https://127.0.0.1:{port}"
        _wait_up(base, context)
        _round(base, context, token, version, argparse.Namespace(requests=1, downloads=1, interval=0))  # warm-up
        attacker = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--idle",
                str(args.idle),
                "--idle-sources",
                str(args.idle_sources),
                "--slowloris",
                str(args.slowloris),
                "--attacker",
                "127.0.0.1",
                str(port),
                str(fleet.deploy.tls.ca_cert),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        times = {kind: {"quiet": [], "attacked": []} for kind in ("health", "download")}
        failures = {"quiet": 0, "attacked": 0}
        held, descriptors = [], []
        order = ["quiet", "attacked", "attacked", "quiet"] * ((args.rounds + 1) // 2)
        for phase in order[: 2 * args.rounds]:
            if phase == "attacked":
                held.append(_command(attacker, "on"))
                descriptors.append(len(os.listdir(f"/proc/{server.pid}/fd")))
            health, downloads, failed = _round(base, context, token, version, args)
            times["health"][phase].append(health)
            times["download"][phase].append(downloads)
            failures[phase] += failed
            if phase == "attacked":
                held[-1] += "; after the round: " + _command(attacker, "off")
                time.sleep(SETTLE_S)
        log_bytes = log.stat().st_size
    finally:
        if attacker is not None:
            attacker.stdin.close()  # it ends at the end of its input
        server.send_signal(signal.SIGINT)
        for process in (attacker, server):
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=20)
                if process.poll() is None:
                    process.kill()

    for kind, unit in (("health", "/v1/health"), ("download", f"{args.tarball_mb:g} MB tarball")):
        quiet, attacked = times[kind]["quiet"], times[kind]["attacked"]
        ratio = round_ratio(attacked, quiet)
        print(
            f"{unit:>16}: quiet median {_ms(quiet)} ms (min-max {_spread(quiet)}); attacked {_ms(attacked)} ms "
            f"({_spread(attacked)}); attacked / quiet {ratio['median']:.2f}x [{ratio['ci95'][0]:.2f}-{ratio['ci95'][1]:.2f}]"
        )
    print(
        f"failed requests: quiet {failures['quiet']}, attacked {failures['attacked']} "
        f"(of {args.rounds * (args.requests + args.downloads)} each)"
    )
    for n, line in enumerate(held):
        print(f"attacked round {n + 1}: {line}")
    print(f"server's open descriptors when attacked: {min(descriptors)}-{max(descriptors)}")
    lines = log.read_text(errors="replace").splitlines()
    others = [line for line in lines if not line.startswith('{"board"')]
    print(
        f"server's log: {log_bytes} bytes, {len(lines) - len(others)} access lines (one per request) and "
        f"{len(others)} others:"
    )
    for line in others[:12]:
        print("   ", line[:220])


def _round(base: str, context: ssl.SSLContext, token: str, version, args) -> tuple[list[float], list[float], int]:
    """Seconds of each /v1/health and download of a round (a new connection each), and failures."""
    health, downloads, failed = [], [], 0
    expected = version.tarball.stat().st_size
    tarball = urllib.request.Request(
        f"{base}/v1/artifacts/mlp/gw/v{version.version}.tar.gz", headers={"Authorization": f"Bearer {token}"}
    )
    every = max(1, args.requests // max(1, args.downloads))
    for n in range(args.requests):
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(base + "/v1/health", timeout=30, context=context) as answer:
                ok = answer.status == 200 and answer.read() == b'{"ok":true}'
        except OSError:
            ok = False
        health.append(time.perf_counter() - started)
        failed += not ok
        if n % every == 0 and len(downloads) < args.downloads:
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(tarball, timeout=60, context=context) as answer:
                    ok = answer.status == 200 and len(answer.read()) == expected
            except OSError:
                ok = False
            downloads.append(time.perf_counter() - started)
            failed += not ok
        time.sleep(args.interval)
    return health, downloads, failed


def _command(attacker: subprocess.Popen, command: str) -> str:
    attacker.stdin.write(command + "\n")
    attacker.stdin.flush()
    return attacker.stdout.readline().strip()


def _wait_up(base: str, context: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(base + "/v1/health", timeout=5, context=context):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ms(rounds: list[list[float]]) -> str:
    return f"{statistics.median(t for r in rounds for t in r) * 1e3:.1f}"


def _spread(rounds: list[list[float]]) -> str:
    values = [t for r in rounds for t in r]
    return f"{min(values) * 1e3:.1f}-{max(values) * 1e3:.1f}"


# -- the attacker process: "on" (answers when the idle connections are open), "off" (closes all) --
async def _attacker(args, host: str, port: str, ca: str) -> None:
    context = ssl.create_default_context(cafile=ca)
    loop = asyncio.get_running_loop()
    stats = {"open": 0, "cut": 0, "refused": 0, "slowloris open": 0, "slowloris cut": 0}
    while True:
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if command != "on":
            return
        stats.update((key, 0) for key in stats)
        started = time.monotonic()
        sources = [f"{IDLE_NET}.{1 + n % args.idle_sources}" for n in range(args.idle)]
        tasks = [asyncio.create_task(_idle(host, int(port), context, source, stats)) for source in sources]
        tasks += [asyncio.create_task(_slowloris(host, int(port), context, stats)) for _ in range(args.slowloris)]
        while stats["open"] < args.idle and time.monotonic() - started < 60:
            await asyncio.sleep(0.1)
        print(
            f"{stats['open']} idle and {stats['slowloris open']} slowloris connections open after "
            f"{time.monotonic() - started:.1f} s",
            flush=True,
        )
        command = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        held = stats["open"]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        print(
            f"{held} idle open; {stats['cut']} idle and {stats['slowloris cut']} slowloris connections cut, "
            f"{stats['refused']} refused",
            flush=True,
        )
        if command != "off":
            return


async def _connect(host: str, port: int, context: ssl.SSLContext, source: str):
    return await asyncio.open_connection(
        host, port, ssl=context, server_hostname=host, local_addr=(source, 0), ssl_handshake_timeout=60
    )


async def _idle(host: str, port: int, context: ssl.SSLContext, source: str, stats: dict) -> None:
    while True:
        try:
            reader, writer = await _connect(host, port, context, source)
        except (OSError, asyncio.TimeoutError):
            stats["refused"] += 1
            await asyncio.sleep(1)
            continue
        stats["open"] += 1
        try:
            await reader.read()
        except OSError:
            pass
        finally:
            stats["open"] -= 1
            writer.close()
        stats["cut"] += 1


async def _slowloris(host: str, port: int, context: ssl.SSLContext, stats: dict) -> None:
    while True:
        try:
            reader, writer = await _connect(host, port, context, SLOWLORIS_ADDRESS)
        except (OSError, asyncio.TimeoutError):
            stats["refused"] += 1
            await asyncio.sleep(1)
            continue
        stats["slowloris open"] += 1
        try:
            writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            for n in range(10_000):
                with contextlib.suppress(asyncio.TimeoutError):
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        break
                writer.write(b"X-Drip-%d: a\r\n" % n)
                await writer.drain()
        except OSError:
            pass
        finally:
            stats["slowloris open"] -= 1
            writer.close()
        stats["slowloris cut"] += 1


if __name__ == "__main__":
    main()
