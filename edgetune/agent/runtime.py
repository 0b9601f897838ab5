"""Run an installed (or staged) release with the TVM runtime only: `tvm.runtime.load_module`
and the Relax VM (`tvm.runtime.vm.VirtualMachine`, the class `tvm.relax.VirtualMachine`
names), so a board with a runtime-only TVM build can run it.

The release's manifest says how to call it (`entry.function`, `entry.inputs` in call order)
and how close its outputs must be to `expected_output.npz` (`inputs.tolerance`). Outputs are
named `output0`, `output1`, ... in the function's return order. Timing follows the host's
measurement (`artifact/measure.py`): `set_input`, then `time_evaluator("invoke_stateful")`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from edgetune.agent.errors import AgentError
from edgetune.agent.run_report import ReferenceCheck
from edgetune.artifact_format.manifest import (
    EXPECTED_OUTPUT_NAME,
    LIBRARY_NAME,
    MANIFEST_NAME,
    REFERENCE_INPUT_NAME,
    Manifest,
)
from edgetune.artifact_format.reference import check_outputs, read_npz


@dataclass(frozen=True)
class TimingSettings:
    number: int = 10
    repeat: int = 3
    min_repeat_ms: int = 0
    cooldown_ms: int = 0
    cache_flush: bool = False


class LoadedRelease:
    """A release directory's library loaded into this process, ready to run."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST_NAME
        self.manifest = Manifest.from_bytes(manifest_path.read_bytes(), str(manifest_path))
        self.device = tvm.cpu()
        self.vm = VirtualMachine(tvm.runtime.load_module(str(self.directory / LIBRARY_NAME)), self.device)

    def run(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        entry = self.manifest.entry
        missing = [name for name in entry.inputs if name not in arrays]
        if missing:
            raise AgentError(
                f"the input has no array named {', '.join(missing)} (the model takes {', '.join(entry.inputs)})"
            )
        self.vm.set_input(entry.function, *[tvm.runtime.tensor(arrays[name], self.device) for name in entry.inputs])
        self.vm.invoke_stateful(entry.function)
        return output_dict(self.vm.get_outputs(entry.function))

    def time(self, settings: TimingSettings) -> list[float]:
        """Seconds per call, one sample per repeat (`run` first: it sets the inputs)."""
        timer = self.vm.time_evaluator(
            "invoke_stateful",
            self.device,
            number=settings.number,
            repeat=settings.repeat,
            min_repeat_ms=settings.min_repeat_ms,
            cooldown_interval_ms=settings.cooldown_ms,
            f_preproc="cache_flush_cpu_non_first_arg" if settings.cache_flush else "",
        )
        return [float(s) for s in timer(self.manifest.entry.function).results]

    def reference_input(self) -> dict[str, np.ndarray]:
        return read_npz(self.directory / REFERENCE_INPUT_NAME)

    def check(self, outputs: Mapping[str, np.ndarray]) -> ReferenceCheck:
        """`outputs` against the expected output of the reference input."""
        result = check_outputs(outputs, read_npz(self.directory / EXPECTED_OUTPUT_NAME), self.manifest.inputs.tolerance)
        return ReferenceCheck(result.ok, result.max_abs_error, result.detail)


def output_dict(result: object) -> dict[str, np.ndarray]:
    """A VM result (one tensor or a tuple of them) as {"output<i>": array}."""
    items = [result] if hasattr(result, "numpy") else list(result)
    return {f"output{i}": item.numpy() for i, item in enumerate(items)}


def reference_check(directory: Path) -> ReferenceCheck:
    """Load the release in `directory`, run its reference input and compare with its expected output."""
    release = LoadedRelease(directory)
    return release.check(release.run(release.reference_input()))
