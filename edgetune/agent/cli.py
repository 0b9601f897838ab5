"""`python -m edgetune.agent --root DIR VERB [--json]`: the board agent's command line.

Argument parsing and printing only; each verb calls one library function. With --json a verb
prints one versioned answer (`answer.py`): its record, or the error that stopped it. Exit status:
0 done, 1 failed (the reason printed, in the record or as the answer's error), 2 bad usage or
configuration (nothing was attempted). TVM is imported only by `run` and `check`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from edgetune.agent.answer import answer_json
from edgetune.agent.errors import AgentConfigError, AgentError
from edgetune.errors import EdgetuneError

if TYPE_CHECKING:  # each verb imports what it needs: a board runs `status` often and little else
    from edgetune.agent.guard import SwitchGuard
    from edgetune.agent.install import ChangeRecord


def _version(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version number (1, 2, ...)")
    return int(text)


def _serial(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a decision serial (0, 1, ...)")
    return int(text)


def _rollback_target(text: str) -> int | str:
    return text if text == "none" else _version(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m edgetune.agent",
        description="edgetune's board agent: fetch, install, roll back and run artifacts.",
    )
    parser.add_argument("--root", required=True, type=Path, help="the agent's directory (agent.json, releases/, ...)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    model = argparse.ArgumentParser(add_help=False, parents=[common])
    model.add_argument("--model", required=True, help="the model's name")
    changing = argparse.ArgumentParser(add_help=False, parents=[model])
    changing.add_argument(
        "--deadline-s",
        type=_seconds,
        metavar="S",
        help="stop before the switch once S seconds have passed (the reference check included)",
    )
    changing.add_argument(
        "--abort-on-hangup",
        action="store_true",
        help="stop before the switch if stdin (the SSH channel that started this) closes",
    )

    p = verbs.add_parser("fetch", parents=[model], help="download and verify the artifact the server offers")
    p.add_argument("--version", type=_version, help="this version instead of the one offered")
    p.add_argument("--allow-downgrade", action="store_true", help="accept a version below the newest installed")
    p.set_defaults(func=_drive_fetch)

    p = verbs.add_parser("install", parents=[changing], help="fetch, check and switch to the offered artifact")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--version", type=_version, help="this version instead of the one offered")
    source.add_argument("--from", dest="tarball", type=Path, help="install this local .tar.gz (no server)")
    p.add_argument(
        "--trust",
        type=Path,
        metavar="FILE",
        help="with --from: take this trust file of the fleet first "
        "(`edgetune pull` writes it beside the tarball), as one from the server would be taken",
    )
    p.add_argument("--allow-downgrade", action="store_true", help="accept a version below the newest installed")
    p.set_defaults(func=_drive_install)

    p = verbs.add_parser("rollback", parents=[changing], help="switch back to a kept release, checking it again")
    p.add_argument(
        "--to",
        type=_rollback_target,
        metavar="N|none",
        help="the kept version (default: the newest below the current one); none: deactivate",
    )
    p.set_defaults(func=_drive_rollback)

    p = verbs.add_parser(
        "sync",
        parents=[common],
        help="install the versions assigned to this board, then report to the server (what a pull timer runs)",
    )
    p.add_argument(
        "--deadline-s", type=_seconds, metavar="S", help="each install stops before its switch after S seconds"
    )
    p.add_argument(
        "--every",
        type=_seconds,
        metavar="S",
        help="run again every S seconds (plus up to 10%% at random), until stopped: a timer for boards with "
        "neither systemd nor cron",
    )
    p.set_defaults(func=_drive_sync)

    p = verbs.add_parser(
        "reset-serial", parents=[common], help="make N the highest decision serial accepted (recovery)"
    )
    p.add_argument("--to", dest="serial", type=_serial, required=True, metavar="N")
    p.set_defaults(func=_drive_reset_serial)

    p = verbs.add_parser("status", parents=[common], help="what runs, since when, with which firmware")
    p.set_defaults(func=_drive_status)

    p = verbs.add_parser("run", parents=[model], help="run the current release here; check and time it")
    p.add_argument("--input", type=Path, help="an .npz with the model's inputs (default: its reference input)")
    p.add_argument("--number", type=int, default=10, help="calls per timing sample (default 10)")
    p.add_argument("--repeat", type=int, default=3, help="timing samples (default 3; 0: do not time)")
    p.add_argument("--min-repeat-ms", type=int, default=0, help="minimum duration of a sample (default 0)")
    p.add_argument("--cooldown-ms", type=int, default=0, help="pause between samples (default 0)")
    p.add_argument("--cache-flush", action="store_true", help="flush CPU caches before each call")
    p.set_defaults(func=_drive_run)

    p = verbs.add_parser("check", parents=[common], help="reference check of a release directory (install's child)")
    p.add_argument("--dir", required=True, type=Path, help="a release or staging directory")
    p.set_defaults(func=_drive_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (EdgetuneError, OSError) as err:  # OSError: e.g. a full or read-only disk
        _print_error(args, err, stream=sys.stdout if args.json else sys.stderr)
        return 2 if isinstance(err, AgentConfigError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _print(args: argparse.Namespace, record: object, lines: list[str]) -> None:
    """The verb's record: its answer with --json, else `lines`."""
    text = json.dumps(answer_json(args.verb, record), sort_keys=True) if args.json else "\n".join(lines)
    print(text, flush=True)


def _print_error(args: argparse.Namespace, err: Exception, stream=None) -> None:
    """What stopped the verb before it had a record: its answer with --json, else a line."""
    text = json.dumps(answer_json(args.verb, error=str(err)), sort_keys=True) if args.json else f"error: {err}"
    print(text, file=stream or sys.stdout, flush=True)


def _drive_fetch(args: argparse.Namespace) -> int:
    from edgetune.agent.fetch import fetch

    fetched = fetch(args.root, args.model, args.version, args.allow_downgrade)
    how = "downloaded"
    if fetched.reused or fetched.resumed_from:
        how = "reused" if fetched.reused else f"resumed at byte {fetched.resumed_from}"
    _print(args, fetched.to_json(), [f"{fetched.model} v{fetched.version}: {how}, verified: {fetched.tarball}"])
    return 0


def _drive_install(args: argparse.Namespace) -> int:
    from edgetune.agent.install import install, install_tarball
    from edgetune.agent.installation import take_trust_file

    if args.trust is not None:
        if args.tarball is None:
            raise AgentError("--trust goes with --from (a download from the server brings the trust file itself)")
        take_trust_file(args.root, args.trust)
    if args.tarball is not None:
        record = install_tarball(args.root, args.model, args.tarball, args.allow_downgrade, _guard(args))
    else:
        record = install(args.root, args.model, args.version, args.allow_downgrade, _guard(args))
    return _print_change(args, record)


def _drive_rollback(args: argparse.Namespace) -> int:
    from edgetune.agent.install import rollback

    if args.to == "none":
        return _print_change(args, rollback(args.root, args.model, deactivate=True, guard=_guard(args)))
    return _print_change(args, rollback(args.root, args.model, to=args.to, guard=_guard(args)))


def _guard(args: argparse.Namespace) -> SwitchGuard:
    from edgetune.agent.guard import SwitchGuard

    return SwitchGuard(args.deadline_s, args.abort_on_hangup)


def _print_change(args: argparse.Namespace, record: ChangeRecord) -> int:
    to, was = (f"v{v}" if v else "none" for v in (record.to_version, record.from_version))
    if record.ok:
        line = f"{record.model}: {record.result.replace('_', ' ')} {to} (was {was})" + (
            f"; {record.error}" if record.error else ""
        )
    else:
        target = f" {to}" if record.to_version else ""
        line = f"{record.model}:{target} failed, {was} stays current: {record.error}"
    _print(args, record, [line])
    return 0 if record.ok else 1


def _drive_sync(args: argparse.Namespace) -> int:
    from edgetune.agent.sync import sync

    while True:
        try:
            record = sync(args.root, args.deadline_s)
            _print(args, record, record.lines())
            ok = record.ok
        except (EdgetuneError, OSError) as err:
            if args.every is None:
                raise
            _print_error(args, err)
        if args.every is None:
            return 0 if ok else 1
        time.sleep(args.every * random.uniform(1.0, 1.1))


def _drive_reset_serial(args: argparse.Namespace) -> int:
    from edgetune.agent.fetch import reset_serial

    record = reset_serial(args.root, args.serial)
    _print(args, record, [f"last decision serial: {record.last_serial} (was {record.previous})"])
    return 0


def _drive_status(args: argparse.Namespace) -> int:
    from edgetune.agent.status import status

    board = status(args.root)
    _print(args, board, board.lines())
    return 0


def _drive_run(args: argparse.Namespace) -> int:
    from edgetune.agent.run import run_current  # imports TVM
    from edgetune.agent.runtime import TimingSettings

    if min(args.number, args.repeat, args.min_repeat_ms, args.cooldown_ms) < 0 or args.number < 1:
        raise AgentConfigError("--number must be at least 1; --repeat, --min-repeat-ms and --cooldown-ms at least 0")
    timing = TimingSettings(args.number, args.repeat, args.min_repeat_ms, args.cooldown_ms, args.cache_flush)
    report = run_current(args.root, args.model, args.input, timing)
    _print(args, report, report.lines())
    return 0 if report.outputs_match is not False else 1


def _drive_check(args: argparse.Namespace) -> int:
    from edgetune.agent.run_report import ReferenceCheck
    from edgetune.agent.runtime import reference_check  # imports TVM

    try:
        result = reference_check(args.dir)
    except Exception as err:  # noqa: BLE001 - whatever the library raises, this process reports it
        result = ReferenceCheck(False, None, f"the library cannot run: {type(err).__name__}: {err}")
    _print(args, result, [f"reference check: {'ok' if result.ok else result.detail}"])
    return 0 if result.ok else 1
