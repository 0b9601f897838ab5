"""Command line: argument parsing only. Each verb lives in its own module with a
`register(subparsers)` that sets `func=drive_<verb>`; the drive function calls one library
function. Every `EdgetuneError` becomes the exit code of its type here (`EXIT_CODES`, the table
docs/cli.md shows); `--verbose` adds the traceback."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback

from edgetune import __version__
from edgetune.cli import (
    build_cmd,
    check_cmd,
    fleet_cmd,
    import_cmd,
    keys_cmd,
    plan_cmd,
    profile_cmd,
    pull_cmd,
    regress_cmd,
    report_cmd,
    rollout_cmd,
    serve_cmd,
    sim_cmd,
    starters_cmd,
    timer_cmd,
    tune_cmd,
    tune_fleet_cmd,
    verify_cmd,
)
from edgetune.errors import (
    ArtifactError,
    DeployError,
    EdgetuneError,
    FleetError,
    Interrupted,
    InventoryError,
    TuneError,
)

CONSOLE_HANDLER = "edgetune-console"

# The exit codes: each exception base type of edgetune.errors, and the code `main` returns when
# one stops a verb (a subclass takes its base's code). A verb whose result failed returns the
# code of the same kind (e.g. `FleetError.exit_code` when a board did not come up). docs/cli.md
# ("Exit codes") shows this table; tests/test_exit_codes.py reads it there and compares.
USAGE = 2  # argparse's code for a command line it refuses; like an invalid inventory, nothing was started
EXIT_CODES: dict[type[BaseException], int] = {
    error_type: error_type.exit_code
    for error_type in (EdgetuneError, InventoryError, FleetError, TuneError, ArtifactError, DeployError, Interrupted)
} | {KeyboardInterrupt: Interrupted.exit_code}

# In the order of the flow: a model's entry, inventory, machines, tuning, artifacts, the whole job, delivery.
VERBS = (
    import_cmd,
    check_cmd,
    plan_cmd,
    sim_cmd,
    fleet_cmd,
    tune_cmd,
    starters_cmd,
    keys_cmd,
    build_cmd,
    verify_cmd,
    profile_cmd,
    tune_fleet_cmd,
    serve_cmd,
    pull_cmd,
    rollout_cmd,
    timer_cmd,
    regress_cmd,
    report_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgetune", description="Tune and ship neural networks to fleets of edge boards."
    )
    parser.add_argument("--version", action="version", version=f"edgetune {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks and debug logs")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.register(subparsers)
    return parser


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record comes, not the one it was made with."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def log_to_console(verbose: bool) -> None:
    """edgetune's messages (progress lines, warnings) as plain lines on stderr, apart from a
    verb's result on stdout (its table or JSON); other libraries' from WARNING on. With
    `--verbose`, every logger's debug messages too. Calling it again replaces its handler."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == CONSOLE_HANDLER]:
        root.removeHandler(handler)
    console = _CurrentStderr()
    console.set_name(CONSOLE_HANDLER)
    console.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(console)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("edgetune").setLevel(logging.DEBUG if verbose else logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_to_console(args.verbose)
    try:
        return int(args.func(args) or 0)
    except EdgetuneError as err:
        if args.verbose:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return exit_code(err)
    except KeyboardInterrupt as err:
        print("interrupted", file=sys.stderr)
        return exit_code(err)


def exit_code(err: BaseException) -> int:
    """The code of `err`'s nearest type in `EXIT_CODES`: its own, else its nearest base's."""
    return next(EXIT_CODES[cls] for cls in type(err).__mro__ if cls in EXIT_CODES)
