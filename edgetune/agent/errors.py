"""The agent's errors. Its CLI exits 2 on `AgentConfigError` (bad usage or configuration:
nothing was attempted) and 1 on any other failure."""

from __future__ import annotations

from edgetune.errors import DeployError


class AgentError(DeployError):
    """An agent operation failed; the board still runs what it ran before."""


class AgentConfigError(AgentError):
    """agent.json, the token, the pinned key or an argument is invalid: fix it and run again."""
