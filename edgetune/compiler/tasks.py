"""The tuning tasks of a device class: every model prepared for the class target, its kernels
extracted, and kernels shared by several models merged into one task (tuned once per class).

A task's weight is how often the class's models call the kernel, each call counted with its
model's inventory weight; its cost (for ordering) is weight x FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.analysis import estimate_tir_flops

from edgetune.compiler.models import load_model
from edgetune.compiler.prepare import extract_kernels, kernel_hash, prepare
from edgetune.compiler.target import build_target
from edgetune.inventory.schema import Fleet, Model


@dataclass(frozen=True)
class KernelTask:
    """One deduplicated kernel of a class: what the plan, the tuner and the reports share."""

    name: str
    workload_hash: str  # MetaSchedule's workload key (structural hash of the kernel)
    flops: float
    weight: float  # sum over models of (calls in the model x model weight)
    uses: tuple[tuple[str, int], ...]  # (model name, calls per inference)

    @property
    def cost(self) -> float:
        return self.weight * self.flops

    def calls_in(self, model: str) -> int:
        return dict(self.uses).get(model, 0)


@dataclass(frozen=True)
class ClassTasks:
    """The prepared models of a class and their deduplicated kernels (TVM objects inside)."""

    prepared: dict[str, tvm.IRModule]  # model name -> prepared module
    tasks: tuple[KernelTask, ...]
    extracted: dict[str, ms.ExtractedTask]  # workload hash -> one extracted instance, of `scheduled` too
    scheduled: tuple[KernelTask, ...] = ()  # the kernels `prepare` scheduled itself: never searched

    @property
    def scheduled_hashes(self) -> list[str]:
        return [kernel.workload_hash for kernel in self.scheduled]


def workload_hash(task: ms.ExtractedTask) -> str:
    return kernel_hash(task.dispatched[0])


def class_tasks(models: tuple[Model, ...], target: tvm.target.Target) -> ClassTasks:
    """Load, prepare and extract every model for `target`, merging shared kernels."""
    prepared: dict[str, tvm.IRModule] = {}
    searched = _Merged()
    scheduled = _Merged()
    for model in models:
        prepared[model.name] = prepare(load_model(model), target)
        kernels = extract_kernels(prepared[model.name], target)
        searched.add(model, kernels.searched)
        scheduled.add(model, kernels.scheduled)
    return ClassTasks(
        prepared=prepared,
        tasks=searched.tasks(),
        extracted=searched.extracted | scheduled.extracted,
        scheduled=scheduled.tasks(),
    )


class _Merged:
    """Kernels of several models merged by workload hash, with each model's calls and weight."""

    def __init__(self) -> None:
        self.extracted: dict[str, ms.ExtractedTask] = {}
        self.uses: dict[str, list[tuple[str, int]]] = {}
        self.weights: dict[str, float] = {}

    def add(self, model: Model, kernels: list[ms.ExtractedTask]) -> None:
        for kernel in kernels:
            key = workload_hash(kernel)
            self.extracted.setdefault(key, kernel)
            self.uses.setdefault(key, []).append((model.name, int(kernel.weight)))
            self.weights[key] = self.weights.get(key, 0.0) + int(kernel.weight) * model.weight

    def tasks(self) -> tuple[KernelTask, ...]:
        return tuple(
            KernelTask(
                name=kernel.task_name,
                workload_hash=key,
                flops=float(estimate_tir_flops(kernel.dispatched[0])),
                weight=self.weights[key],
                uses=tuple(self.uses[key]),
            )
            for key, kernel in self.extracted.items()
        )


def class_task_list(fleet: Fleet, device_class: str, models: tuple[Model, ...]) -> tuple[KernelTask, ...]:
    """The tasks of `models` on the class's target."""
    return class_tasks(models, build_target(fleet.device_class(device_class).profile)).tasks
