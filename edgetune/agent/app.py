"""The runtime library for applications on a board: load the release a rollout put in place, run
it, and follow rollouts (docs/app.md). It ships in the agent's bundle and needs what the agent
needs (numpy, cryptography, the TVM runtime):

    import sys; sys.path.insert(0, "<board workdir>/agent/edgetune-agent.pyz")
    from edgetune.agent.app import Model
    model = Model.open("<board workdir>", "mlp")
    outputs = model.run(x=array)        # {"output0": array, ...}; model.inputs / .outputs say what
    model.reload_if_changed()           # between calls: the release a rollout switched to

`open` and `reload_if_changed` verify the release's files against its signed manifest with the
keys the board trusts, and load it with the TVM runtime alone. `reload_if_changed` loads the new
release before it swaps, so every call runs wholly on one version; a release that cannot be
verified or loaded leaves the one in use (the error is raised). Calls are serialized (one at a
time per `Model`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import check_model_name
from edgetune.agent.installation import Installation
from edgetune.agent.runtime import LoadedRelease, ReferenceCheck
from edgetune.artifact_format.manifest import EXPECTED_OUTPUT_NAME, REFERENCE_INPUT_NAME, Interface, TensorSpec
from edgetune.artifact_format.reference import read_npz
from edgetune.artifact_format.verify import verify_artifact
from edgetune.errors import EdgetuneError

AGENT_DIR = "agent"


class ModelError(AgentError):
    """The model cannot be opened, reloaded or run as asked; the message says why."""


@dataclass(frozen=True)
class _Loaded:
    version: int
    release: LoadedRelease
    interface: Interface


class Model:
    """One model's active release on this board, loaded (see the module docstring)."""

    def __init__(self, installation: Installation, name: str, loaded: _Loaded):
        self._installation, self.name, self._loaded = installation, name, loaded
        self._calls = threading.Lock()

    @classmethod
    def open(cls, workdir: str | Path, name: str) -> Model:
        """The active release of model `name` under the board's `workdir` (or the agent's root
        directory itself), verified and loaded."""
        root = Path(workdir)
        if not (root / "agent.json").exists():
            root = root / AGENT_DIR
        try:
            installation = Installation.open(root)
        except AgentError as err:
            raise ModelError(f"{root}: not an edgetune agent's directory ({err})") from None
        version = installation.tree.current_version(check_model_name(name))
        if version is None:
            raise ModelError(f"no release of {name} is active on {installation.config.board} ({root}): roll one out")
        return cls(installation, name, _load(installation, name, version))

    @property
    def version(self) -> int:
        return self._loaded.version

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._loaded.interface.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._loaded.interface.outputs

    def run(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """The outputs for `arrays` (one per input, by name, of its dtype and shape)."""
        with self._calls:
            loaded = self._loaded
            _check_arrays(loaded.interface, arrays)
            return loaded.release.run(arrays)

    def reference_input(self) -> dict[str, np.ndarray]:
        """The release's reference input (`reference_input.npz`): what its build checked it with."""
        return self._loaded.release.reference_input()

    def check(self, outputs: dict[str, np.ndarray]) -> ReferenceCheck:
        """`outputs` of the reference input against the release's expected output, within its
        manifest's tolerance."""
        return self._loaded.release.check(outputs)

    def reload_if_changed(self) -> bool:
        """Swap to the release `current` points to now, if it is another one; whether it swapped."""
        version = self._installation.tree.current_version(self.name)
        if version == self._loaded.version:
            return False
        if version is None:
            raise ModelError(
                f"no release of {self.name} is active any more (rolled back to none); still running "
                f"v{self._loaded.version}"
            )
        loaded = _load(self._installation, self.name, version)
        with self._calls:
            self._loaded = loaded
        return True


def _load(installation: Installation, name: str, version: int) -> _Loaded:
    directory = installation.tree.release(name, version)
    try:
        manifest = verify_artifact(directory, installation.trusted(take_offered=False).release_keys)
        release = LoadedRelease(directory)
    except (OSError, EdgetuneError) as err:
        raise ModelError(f"v{version} of {name} ({directory}) cannot be used: {err}") from None
    except Exception as err:  # the TVM runtime's own errors (a library that does not load)
        raise ModelError(f"v{version} of {name} ({directory}) cannot be loaded: {err}") from None
    return _Loaded(version, release, manifest.interface or _interface_from_reference(directory, manifest.entry.inputs))


def _interface_from_reference(directory: Path, inputs: tuple[str, ...]) -> Interface:
    """For a manifest older than its interface: the reference data's shapes and dtypes."""
    given, expected = read_npz(directory / REFERENCE_INPUT_NAME), read_npz(directory / EXPECTED_OUTPUT_NAME)
    spec = lambda name, array: TensorSpec(name, tuple(array.shape), str(array.dtype))  # noqa: E731
    return Interface(
        tuple(spec(n, given[n]) for n in inputs),
        tuple(spec(n, expected[n]) for n in sorted(expected, key=lambda n: int(n.removeprefix("output")))),
    )


def _check_arrays(interface: Interface, arrays: dict[str, np.ndarray]) -> None:
    names = [spec.name for spec in interface.inputs]
    unknown, missing = sorted(set(arrays) - set(names)), [n for n in names if n not in arrays]
    if unknown or missing:
        raise ModelError(
            f"the model takes {', '.join(names)}; "
            + "; ".join(
                ([f"missing: {', '.join(missing)}"] if missing else [])
                + ([f"unknown: {', '.join(unknown)}"] if unknown else [])
            )
        )
    for spec in interface.inputs:
        array = arrays[spec.name]
        if not isinstance(array, np.ndarray):
            raise ModelError(f"{spec.name}: a numpy array is needed, got {type(array).__name__}")
        if str(array.dtype) != spec.dtype:
            raise ModelError(f"{spec.name}: dtype {array.dtype}, the model takes {spec.dtype}")
        if len(array.shape) != len(spec.shape) or any(
            isinstance(want, int) and got != want for got, want in zip(array.shape, spec.shape)
        ):
            raise ModelError(f"{spec.name}: shape {tuple(array.shape)}, the model takes {spec.shape}")
