"""The host's half of signed decisions (`artifact_format.decision`): serials that never go back,
and the signer the artifact server answers offers with: the decision key, never the artifact
key (`deploy.keys.OnlineKeys`), its trust file sent with every offer.

Serials: one counter for the fleet, in `<workdir>/state/decision-serial.json`, so every board
sees its serials grow. The next serial is the current time in milliseconds, or the last one
plus one if that is not above it (a clock set back); it is written (atomically, under an flock)
before the decision leaves, so a restarted server never signs a serial twice or goes back. A
serial more than a day ahead of the clock is never signed (boards refuse it too);
`edgetune fleet reset-serial` restarts serials from the clock on the host and the boards.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgetune.agent.client import Offer
from edgetune.artifact_format.codec import canonical_bytes, load_versioned, rule
from edgetune.artifact_format.decision import new_decision, serial_lead_problem, sign_decision
from edgetune.deploy.keys import OnlineKeys
from edgetune.deploy.offer import Choice
from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir

SERIAL_STATE = "decision-serial"


@dataclass(frozen=True)
class SerialState:
    """`decision-serial.json`: the last serial signed (a file without the version keys, as
    written before it carried them, reads as version 1)."""

    SCHEMA = "edgetune.decision-serial"
    VERSION = 1
    serial: int = rule(minimum=0)


class SerialCounter:
    """Strictly increasing serials, kept in `path` across restarts (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def next(self, now: float | None = None) -> int:
        """The next serial, for a decision signed at `now` (default: the clock). One far ahead of
        the clock is refused (DeployError), never signed: boards would refuse it, or, having
        taken one, every later decision."""
        now = time.time() if now is None else now
        with self._locked():
            serial = max(int(now * 1000), self.last() + 1)
            problem = serial_lead_problem(serial, now)
            if problem:
                raise DeployError(
                    f"{self.path}: the next decision's {problem}: this host's clock was once ahead, or "
                    f"the file was changed; if the clock is right now, run `edgetune fleet reset-serial` "
                    "(it restarts serials from the clock, on this host and every board)"
                )
            self._write(serial)
        return serial

    def reset(self, now: float | None = None) -> int:
        """Restart serials from the clock (`now`); the serial every decision from now on is above."""
        serial = int((time.time() if now is None else now) * 1000)
        with self._locked():
            self._write(serial)
        return serial

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _write(self, serial: int) -> None:
        record = {"schema": SerialState.SCHEMA, "schema_version": SerialState.VERSION, "serial": serial}
        write_atomic(self.path, canonical_bytes(record))

    def last(self) -> int:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as err:
            raise DeployError(f"{self.path}: unreadable ({err.strerror}); {_IF_REMOVED}") from None
        try:
            state = load_versioned(
                SerialState,
                data,
                str(self.path),
                SerialState.SCHEMA,
                SerialState.VERSION,
                error=DeployError,
                unversioned_is_current=True,
            )
        except DeployError as err:
            raise DeployError(f"{err}; {_IF_REMOVED}") from None
        return state.serial


_IF_REMOVED = (
    "it keeps decision serials growing: if the host's clock is right, `edgetune fleet reset-serial` writes it anew"
)


class DecisionSigner:
    """Turns the server's choice for a board into the offer it sends: the signed decision."""

    def __init__(self, fleet: Fleet):
        self.keys = OnlineKeys(fleet)
        self.ttl_s = fleet.deploy.decision_ttl_s
        self.serials = serial_counter(fleet)

    def offer(self, choice: Choice, nonce: str | None = None) -> Offer:
        """The signed decision for `choice`, echoing the board's request's `nonce`."""
        stored, now = choice.stored, time.time()
        decision = new_decision(
            board=choice.board.name,
            device_class=choice.board.device_class,
            model=stored.model,
            version=stored.version,
            manifest_sha256=stored.manifest_sha256,
            tarball_size=choice.tarball_size,
            pinned=choice.pinned,
            requested=choice.requested,
            serial=self.serials.next(now),
            issued_at=now,
            ttl_s=self.ttl_s,
            nonce=nonce,
        )
        key, trust = self.keys.current()
        text, signature = sign_decision(key, decision)
        base = f"/v1/artifacts/{stored.model}/{stored.device_class}/v{stored.version}"
        return Offer(
            board=decision.board,
            device_class=decision.device_class,
            model=decision.model,
            version=decision.version,
            pinned=decision.pinned,
            manifest_url=f"{base}/manifest.json",
            signature_url=f"{base}/manifest.sig",
            tarball_url=f"{base}.tar.gz",
            manifest_sha256=decision.manifest_sha256,
            tarball_size=decision.tarball_size,
            decision=text,
            decision_signature=signature,
            trust=trust,
        )


def serial_counter(fleet: Fleet) -> SerialCounter:
    return SerialCounter(Workdir(fleet.workdir).state_file(SERIAL_STATE))
