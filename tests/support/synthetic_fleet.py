"""A synthetic fleet state of any size, written in the real formats (fleet.yaml, `deployed.json`
through `fleet.state`, journal events through `fleet.journal`, a tuning `summary.json` per class
and model): what the dashboard reads, without a board, a tracker or a tuning run. Used by the
dashboard tests and bench/dashboard_render.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from unittest import mock

from support.tests_samples import FAKE_PRIVATE_KEY

REPO = Path(__file__).resolve().parents[2]
CLASSES = (("gw-fast", "x86-64-v3"), ("gw-slow", "x86-64-v2"))
SLOW_EVERY = 97  # one board in this many is found slower by the synthetic regress run


def write_synthetic_fleet(directory: Path, boards: int, seed: int = 0, deploy_port: int | None = None):
    """A fleet of `boards` boards over two classes, one model, with a status, a rollout and a
    regress run recorded (and a `deploy` section on loopback with `deploy_port`); returns the
    loaded Fleet."""
    from edgetune.artifact_format.codec import FrozenMap
    from edgetune.fleet.journal import record_event
    from edgetune.fleet.state import DeployedState, write_state
    from edgetune.inventory import load_fleet

    random.seed(seed)
    names = [(f"b{i:04d}", CLASSES[i % 2][0]) for i in range(boards)]
    lines = [
        "version: 1",
        "name: synthetic",
        "workdir: work",
        "trackers:",
        "  - {name: host, bind_host: 127.0.0.1, public_address: 127.0.0.1, port: 9390}",
        "ssh: {user: root, key: id_ed25519, known_hosts: known_hosts}",
        "device_classes:",
    ]
    lines += [f"  - {{name: {c}, profile: {REPO}/device_profiles/{p}.yaml}}" for c, p in CLASSES]
    lines += ["boards:"] + [
        f"  - {{name: {n}, address: 10.{i // 250 % 256}.{i // 64000}.{i % 250 + 1}, "
        f"device_class: {c}, python: /usr/bin/python3, workdir: /var/lib/edgetune}}"
        for i, (n, c) in enumerate(names)
    ]
    lines += [
        "models:",
        "  - {name: mlp, builtin: mlp, inputs: [{name: x, shape: [1, 256]}]}",
        "tuning: {trials_per_class: 64, trials_per_iter: 8}",
        "artifacts: {dir: artifacts, signing_key: work/keys/signing.key, public_key: work/keys/signing.pub}",
    ]
    if deploy_port:
        lines.append(f'deploy: {{bind: "127.0.0.1:{deploy_port}", url: "https://127.0.0.1:{deploy_port}"}}')
    (directory / "fleet.yaml").write_text("\n".join(lines) + "\n")
    (directory / "id_ed25519").write_text(FAKE_PRIVATE_KEY)
    (directory / "id_ed25519").chmod(0o600)
    fleet = load_fleet(directory / "fleet.yaml")
    write_state(fleet, DeployedState(FrozenMap({n: FrozenMap({"mlp": 1}) for n, _ in names})))
    with mock.patch("edgetune.fleet.journal.datetime") as clock:
        for when, kind, fields in _events(names):
            clock.now.return_value.strftime.return_value = when
            record_event(fleet, kind, **fields)
    for device_class, _ in CLASSES:
        summary = directory / "work" / "reports" / device_class / "mlp" / "summary.json"
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps(_summary(device_class), indent=2))
    return fleet


def slowed(name: str) -> bool:
    return int(name[1:]) % SLOW_EVERY == 5


def _events(names):
    status = [
        {
            "name": n,
            "device_class": c,
            "reachable": int(n[1:]) % 50 != 7,
            "registered": True,
            "firmware": "fw 1.0",
            "firmware_changed": False,
            "deployed": {"mlp": 1},
        }
        for n, c in names
    ]
    rollout = [
        {
            "board": n,
            "class": c,
            "model": "mlp",
            "from_version": None,
            "to_version": 1,
            "result": "installed",
            "runs": 1,
            "downgrade": False,
            "error": None,
        }
        for n, c in names
    ]
    later = [
        dict(s, firmware="fw 2.0" if slowed(s["name"]) else "fw 1.0", firmware_changed=slowed(s["name"]))
        for s in status
    ]
    verdicts = [_verdict(n, c) for n, c in names]
    return [
        ("2026-12-01T10:00:00Z", "status", {"boards": status}),
        ("2026-12-01T10:05:00Z", "rollout", {"model": "mlp", "stopped": None, "outcomes": rollout}),
        ("2026-12-01T12:00:00Z", "status", {"boards": later}),
        ("2026-12-01T12:10:00Z", "regress", {"verdicts": verdicts}),
    ]


def _verdict(name: str, device_class: str) -> dict:
    ratio = 1.9 if slowed(name) else random.uniform(0.95, 1.05)
    return {
        "board": name,
        "device_class": device_class,
        "model": "mlp",
        "version": 1,
        "verdict": "slower" if slowed(name) else "ok",
        "ratio": ratio,
        "interval": [ratio * 0.95, ratio * 1.05],
        "median_ms": 0.05 * ratio,
        "baseline_ms": 0.05,
        "firmware_changed": slowed(name),
        "detail": "",
    }


def _summary(device_class: str) -> dict:
    tasks = [
        {
            "name": f"fused_dense{i}",
            "workload_hash": f"{device_class}-{i}",
            "flops": 1e6,
            "calls": 1,
            "trials": 16,
            "failed_trials": 0,
            "best_latency_s": 1e-5,
            "gflops": 100.0,
            "stopped": "knee" if i == 0 else None,
        }
        for i in range(3)
    ]
    early = [[t, 1e-4 - t * 1e-6, 3 - t // 6] for t in range(1, 17)]
    curve = [[t, 8e-5 - (t - 17) * 5e-7] for t in range(17, 49)]
    return {
        "schema": "edgetune.tuning-summary",
        "schema_version": 1,
        "device_class": device_class,
        "model": "mlp",
        "trials": 48,
        "trials_this_run": 48,
        "tuning_time_s": 60.0,
        "tasks_total": 3,
        "tasks_tuned": 3,
        "estimated_latency_s": curve[-1][1],
        "tasks": tasks,
        "curve": curve,
        "early_curve": early,
        "knee": {"trials": 30, "latency_s": 7e-5},
        "trials_to_within_10pct": 30,
        "borrowed_from": None,
        "stopped": None,
        "firmware": {},
    }
