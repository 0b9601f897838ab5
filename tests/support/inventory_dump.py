"""For the tests: schema records written back as the plain data of fleet.yaml and profile files (version 1).

`load_fleet(dump) == fleet`: the round trip is what keeps the schema and loader honest. Paths
are written absolute, so a dumped inventory loads from anywhere.
"""

from __future__ import annotations

from typing import Any

from edgetune.inventory.schema import (
    NO_SSH_CONFIG,
    SCHEMA_VERSION,
    Board,
    DeviceClass,
    DeviceProfile,
    EarlyStop,
    FixedValue,
    Fleet,
    ModelInput,
    SshSettings,
    ValueRange,
)


def profile_to_dict(profile: DeviceProfile) -> dict[str, Any]:
    m = profile.measurement
    return {
        "version": SCHEMA_VERSION,
        "name": profile.name,
        "description": profile.description,
        "target": profile.target_json(),
        "cross_compiler": profile.cross_compiler or "host",
        "runtime": {"threads": profile.runtime_threads},
        "measurement": {
            "number": m.number,
            "repeat": m.repeat,
            "min_repeat_ms": m.min_repeat_ms,
            "cooldown_ms": m.cooldown_ms,
            "compare": {
                "rounds": m.compare.rounds,
                "repeat": m.compare.repeat,
                "min_repeat_ms": m.compare.min_repeat_ms,
            },
        },
        "firmware_command": profile.firmware_command,
        "hardware": dict(profile.hardware),
    }


def fleet_to_dict(fleet: Fleet) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "name": fleet.name,
        "workdir": str(fleet.workdir),
        "trackers": [
            {
                "name": t.name,
                "bind_host": t.bind_host,
                "public_address": t.public_address,
                "port": t.port,
                "port_end": t.port_end,
            }
            for t in fleet.trackers
        ],
        "device_classes": [_device_class(c) for c in fleet.device_classes],
        "boards": [_board(b) for b in fleet.boards],
        "models": [_model(m) for m in fleet.models],
        "tuning": {
            "trials_per_task": fleet.tuning.trials_per_task,
            "trials_per_class": fleet.tuning.trials_per_class,
            "trials_per_class_override": dict(fleet.tuning.trials_per_class_override),
            "trials_per_iter": fleet.tuning.trials_per_iter,
            "max_trials_per_task": fleet.tuning.max_trials_per_task,
            "time_limit_s": fleet.tuning.time_limit_s,
            "early_stop": _early_stop(fleet.tuning.early_stop),
            "borrow": dict(fleet.tuning.borrow),
        },
        "artifacts": {
            "dir": str(fleet.artifacts.dir),
            "signing_key": str(fleet.artifacts.signing_key),
            "public_key": str(fleet.artifacts.public_key),
        },
    }
    if fleet.sim is not None:
        data["sim"] = {
            "bridge": fleet.sim.bridge,
            "host_address": fleet.sim.host_address,
            "cache": str(fleet.sim.cache),
        }
    data["regress"] = {"threshold": fleet.regress.threshold, "confidence": fleet.regress.confidence}
    if fleet.deploy is not None:
        d = fleet.deploy
        data["deploy"] = {
            "bind": f"{d.bind_host}:{d.port}",
            "url": d.url,
            "tokens_dir": str(d.tokens_dir),
            "keep_releases": d.keep_releases,
            "tls": d.tls is not None,
            "decision_ttl_s": d.decision_ttl_s,
            "max_connections": d.max_connections,
            "max_connections_per_client": d.max_connections_per_client,
            "header_timeout_s": d.header_timeout_s,
            "keepalive_timeout_s": d.keepalive_timeout_s,
            "parallel": d.parallel,
        }
    return data


def _device_class(device_class: DeviceClass) -> dict[str, Any]:
    data = {"name": device_class.name, "profile": str(device_class.profile.path), "pin": dict(device_class.pin)}
    if device_class.tuning_pool is not None:
        data["tuning_pool"] = list(device_class.tuning_pool)
    return data


def _early_stop(early_stop: EarlyStop | None) -> dict[str, Any] | bool:
    return False if early_stop is None else {"window": early_stop.window, "min_gain": early_stop.min_gain}


def _ssh(ssh: SshSettings) -> dict[str, Any]:
    return {
        "user": ssh.user,
        "port": ssh.port,
        "key": str(ssh.key) if ssh.key else None,
        "known_hosts": str(ssh.known_hosts) if ssh.known_hosts else None,
        "config": str(ssh.config) if ssh.config else NO_SSH_CONFIG,
        "host_key_policy": ssh.host_key_policy,
        "passphrase_env": ssh.passphrase_env,
        "connect_timeout_s": ssh.connect_timeout_s,
        "command_timeout_s": ssh.command_timeout_s,
    }


def _board(board: Board) -> dict[str, Any]:
    data = {
        "name": board.name,
        "address": board.address,
        "device_class": board.device_class,
        "tracker": board.tracker,
        "python": board.python,
        "workdir": board.workdir,
        "ssh": _ssh(board.ssh),
        "threads": board.threads,
        "pin": dict(board.pin),
        "token_env": board.token_env,
        "labels": dict(board.labels),
    }
    if board.simulated is not None:
        data["simulated"] = {"cpu_quota": board.simulated.cpu_quota, "arch": board.simulated.arch}
    return data


def _model(model) -> dict[str, Any]:
    data = {
        "name": model.name,
        "inputs": [_input(i) for i in model.inputs],
        "weight": model.weight,
        "layout": model.layout,
    }
    if model.reference_input:
        data["reference_input"] = str(model.reference_input)
    if model.builtin:
        data["builtin"] = model.builtin
    else:
        data["onnx"] = str(model.onnx)
        data["quantized_weights"] = model.quantized_weights
    if model.on_switch is not None:
        data["on_switch"] = model.on_switch
    if model.health is not None:
        data["health"] = {"command": model.health.command, "timeout_s": model.health.timeout_s}
    return data


def _input(inp: ModelInput) -> dict[str, Any]:
    data: dict[str, Any] = {"name": inp.name, "shape": list(inp.shape), "dtype": inp.dtype}
    if isinstance(inp.values, FixedValue):
        data["values"] = {"fixed": inp.values.value}
    elif isinstance(inp.values, ValueRange):
        data["values"] = {"range": [inp.values.low, inp.values.high]}
    return data
