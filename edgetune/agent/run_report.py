"""What the agent's `run` answers: its record, without TVM, so the host decodes it (regress)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


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

    def to_json(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        match = {True: "outputs match", False: f"OUTPUTS DIFFER ({self.detail})", None: "no expected output"}
        timing = f"median {self.median_ms:.4f} ms over {self.repeat} repeats" if self.samples_s else "not timed"
        return [f"{self.model} v{self.version} on {self.board}: {match[self.outputs_match]}, "
                f"max |error| {self.max_abs_error}; {timing}"]
