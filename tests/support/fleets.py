"""Small fleets for the tuning tests, built directly as inventory records, and kernel tasks for their plans."""

from __future__ import annotations

from pathlib import Path

from edgetune.compiler.tasks import KernelTask
from edgetune.inventory.schema import (
    ArtifactSettings,
    Board,
    DeviceClass,
    DeviceProfile,
    Fleet,
    Measurement,
    Model,
    ModelInput,
    Runtime,
    SshSettings,
    Tracker,
    TuningPolicy,
)

V3 = {"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": 1}  # AVX2: runs on every host here
V2 = {"kind": "llvm", "mcpu": "x86-64-v2", "num-cores": 1}


def profile(name: str, target: dict) -> DeviceProfile:
    return DeviceProfile(
        name=name,
        path=Path(f"device_profiles/{name}.yaml"),
        description=name,
        target=target,
        cross_compiler=None,
        runtime=Runtime(threads=1),
        measurement=Measurement(number=2, repeat=3, min_repeat_ms=5),
        firmware_command="uname -a",
        hardware={},
    )


def mlp(name: str = "mlp", weight: float = 1.0) -> Model:
    return Model(name=name, inputs=(ModelInput("x", (1, 256)),), builtin="mlp", weight=weight)


def make_fleet(
    workdir: Path,
    port: int,
    classes: dict[str, dict],
    boards: dict[str, int],
    models: tuple[Model, ...],
    trials: int,
    per_iter: int = 8,
    per_task: int | None = 32,
    borrow: dict[str, str] | None = None,
    time_limit_s: float | None = None,
) -> Fleet:
    """A fleet on a loopback tracker: `classes` name -> target, `boards` name -> board count."""
    tracker = Tracker("host", "127.0.0.1", "127.0.0.1", port, port + 10)
    return Fleet(
        path=workdir / "fleet.yaml",
        name="test",
        workdir=workdir,
        trackers=(tracker,),
        device_classes=tuple(DeviceClass(n, profile(n, t)) for n, t in classes.items()),
        boards=tuple(
            Board(f"{c}-{i}", "127.0.0.1", c, "host", "python", "/tmp", SshSettings())
            for c, n in boards.items()
            for i in range(n)
        ),
        models=models,
        tuning=TuningPolicy(trials, {}, per_iter, per_task, time_limit_s, borrow or {}),
        artifacts=ArtifactSettings(workdir / "artifacts", workdir / "k", workdir / "k.pub"),
        sim=None,
    )


def task(name: str, flops: float, weight: float = 1.0, model: str = "mlp") -> KernelTask:
    return KernelTask(name, f"h-{name}", flops, weight, ((model, int(weight)),))


def tasks_named(count: int) -> tuple[KernelTask, ...]:
    return tuple(task(f"t{i:02d}", 1e6 * (count - i)) for i in range(count))
