"""`run`: the current release of a model, loaded in this process, run and timed.

Needs TVM (`runtime.py`): the CLI imports this module only for `run`.
The regression check calls it over SSH and parses `--json`: whether the outputs match the
expected output (reference input only), the max abs error, and the raw timing samples.
"""

from __future__ import annotations

import os
import statistics
import zipfile
from pathlib import Path

import numpy as np

from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import check_model_name
from edgetune.agent.installation import Installation
from edgetune.agent.run_report import RunReport
from edgetune.agent.runtime import LoadedRelease, TimingSettings
from edgetune.artifact_format.reference import read_npz
from edgetune.artifact_format.verify import verify_artifact


def run_current(
    root: Path, model: str, input_path: Path | None = None, timing: TimingSettings = TimingSettings()
) -> RunReport:
    """Run (and time, unless `timing.repeat` is 0) the current release of `model`; its files
    are verified against the pinned key first."""
    installation = Installation.open(root)
    version = installation.tree.current_version(check_model_name(model))
    if version is None:
        raise AgentError(f"no release of {model} is active on {installation.config.board}: install one first")
    directory = installation.tree.release(model, version)
    verify_artifact(directory, installation.trusted().release_keys)
    given = _read_input(input_path) if input_path else None
    os.environ.setdefault("TVM_NUM_THREADS", str(installation.config.threads))
    try:
        release = LoadedRelease(directory)
        outputs = release.run(given if given is not None else release.reference_input())
        check = release.check(outputs) if given is None else None
        samples = release.time(timing) if timing.repeat > 0 else []
    except (RuntimeError, ValueError) as err:  # TVM's errors are RuntimeErrors
        raise AgentError(f"{model} v{version} cannot run on this board: {type(err).__name__}: {err}") from None
    return RunReport(
        board=installation.config.board,
        model=model,
        version=version,
        input=str(input_path) if input_path else "reference",
        outputs={name: tuple(array.shape) for name, array in outputs.items()},
        outputs_match=check.ok if check else None,
        max_abs_error=check.max_abs_error if check else None,
        detail=check.detail if check else "",
        threads=os.environ["TVM_NUM_THREADS"],
        number=timing.number,
        repeat=timing.repeat,
        min_repeat_ms=timing.min_repeat_ms,
        samples_s=tuple(samples),
        median_ms=statistics.median(samples) * 1e3 if samples else None,
    )


def _read_input(path: Path) -> dict[str, np.ndarray]:
    try:
        return read_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise AgentError(f"cannot read the input {path} ({err}): give an .npz of the model's inputs") from None
