"""The ways a board or the host can fail to be driven, one `FleetError` subclass each.

Every message names the board (or host step) and says what to do next; the CLI prints it as is.
"""

from __future__ import annotations

from edgetune.errors import FleetError


class SshConnectRefused(FleetError):
    """Nothing listens on the SSH port of the board or of a bastion on the way."""


class SshTimeout(FleetError):
    """The board did not answer (connect) or a command ran too long (command timeout)."""


class SshUnreachable(FleetError):
    """No route to the board (link down, wrong address)."""


class SshAuthFailed(FleetError):
    """The board refused our key, or the key could not be read."""


class SshConfigInvalid(FleetError):
    """The ssh config file cannot be read, or sets a value edgetune cannot use for a board."""


class HostKeyUnknown(FleetError):
    """The board's host key is not in known_hosts: the operator must trust it explicitly."""


class HostKeyMismatch(FleetError):
    """The board's host key differs from the recorded one: always refused."""


class CommandFailed(FleetError):
    """A command on a board exited non-zero."""


class BoardNotReady(FleetError):
    """Preflight found the board unfit to serve (wrong TVM, no TVM runtime, no disk)."""


class SimError(FleetError):
    """The simulated fleet cannot be created or removed on this machine."""
