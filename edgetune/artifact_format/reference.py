"""Reference data of an artifact: deterministic `.npz` files, the output check and its tolerance.

`numpy.savez` stamps each zip member with the current time, so the same arrays would give a
different sha256 at every build. `write_npz` writes the same format (one `.npy` per array,
stored, no compression) with a fixed timestamp; `numpy.load` reads it.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgetune.artifact_format.manifest import Tolerance

_FIXED_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
FLOAT_TOLERANCE = Tolerance(rtol=1e-4, atol=1e-5)
# A quantized model's output may lie this many times the spread of two correct executions away
# from the reference (`edgetune.compiler.models.rounding_spread`): the spread is measured on one
# input, and a build's own rounding flips land elsewhere (YOLOv8n int8: TVM 10.0 from the
# definition where onnxruntime's int8 kernels are 13.8, on the same input).
SPREAD_FACTOR = 2.0


def output_tolerance(rounding_spread: float) -> Tolerance:
    """The float tolerance, its atol widened to `SPREAD_FACTOR` x the model's rounding spread."""
    return Tolerance(rtol=FLOAT_TOLERANCE.rtol, atol=max(FLOAT_TOLERANCE.atol, SPREAD_FACTOR * rounding_spread))


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Deterministic `.npz` bytes: members sorted by name, fixed timestamps."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, mode="w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_FIXED_ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return out.getvalue()


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


@dataclass(frozen=True)
class OutputCheck:
    ok: bool
    max_abs_error: float
    detail: str  # empty when ok


def check_outputs(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], tolerance: Tolerance
) -> OutputCheck:
    """Every expected output present, same shape, and within `tolerance` (numpy.allclose)."""
    worst, problems = 0.0, []
    for name, want in sorted(expected.items()):
        got = actual.get(name)
        if got is None or got.shape != want.shape:
            problems.append(f"{name}: shape {None if got is None else got.shape}, expected {want.shape}")
            continue
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
        worst = max(worst, err)
        if not np.allclose(got, want, rtol=tolerance.rtol, atol=tolerance.atol):
            problems.append(f"{name}: max |error| {err:.3g} exceeds rtol {tolerance.rtol:g} / atol {tolerance.atol:g}")
    return OutputCheck(ok=not problems, max_abs_error=worst, detail="; ".join(problems))
