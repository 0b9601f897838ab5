"""The one exception hierarchy of edgetune. Each base type's `exit_code` is the code `cli.main`
returns when an error of that type (or of a subclass: none sets its own) stops a verb
(`cli.EXIT_CODES`; the table is in docs/cli.md, "Exit codes")."""


class EdgetuneError(Exception):
    """Base of every error edgetune reports to a user. The message says what to do next."""

    exit_code = 1


class InventoryError(EdgetuneError):
    """fleet.yaml or a device profile is invalid. Nothing has been started."""

    exit_code = 2


class FleetError(EdgetuneError):
    """A machine of the fleet could not be reached or driven."""

    exit_code = 3


class TuneError(EdgetuneError):
    """Tuning could not run or could not finish."""

    exit_code = 4


class ArtifactError(EdgetuneError):
    """An artifact could not be built, signed, stored or verified."""

    exit_code = 5


class Interrupted(EdgetuneError):
    """The user stopped the run (Ctrl-C, SIGTERM); what was finished is kept."""

    exit_code = 130


class DeployError(EdgetuneError):
    """An artifact could not be served, downloaded, installed or rolled out."""

    exit_code = 6
