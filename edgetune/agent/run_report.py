"""What the agent's `run` and `check` answer: their records, without TVM, so that whoever asked
(the host's regress, an install's check child) decodes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReferenceCheck:
    """A release's outputs on its reference input against its expected output."""

    ok: bool
    max_abs_error: float | None  # None: the library could not run
    detail: str  # empty when ok


@dataclass(frozen=True)
class RunReport:
    board: str
    model: str
    version: int
    input: str  # "reference" or the path of the input given
    outputs: dict[str, tuple[int, ...]]  # output name -> shape
    outputs_match: bool | None  # vs expected_output.npz; None for another input
    max_abs_error: float | None
    detail: str  # why they do not match (empty otherwise)
    threads: str  # TVM_NUM_THREADS
    number: int
    repeat: int
    min_repeat_ms: int
    samples_s: tuple[float, ...]  # seconds per call, one per repeat
    median_ms: float | None

    def lines(self) -> list[str]:
        match = {True: "outputs match", False: f"OUTPUTS DIFFER ({self.detail})", None: "no expected output"}
        timing = f"median {self.median_ms:.4f} ms over {self.repeat} repeats" if self.samples_s else "not timed"
        return [
            f"{self.model} v{self.version} on {self.board}: {match[self.outputs_match]}, "
            f"max |error| {self.max_abs_error}; {timing}"
        ]
