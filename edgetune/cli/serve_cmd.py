"""`edgetune serve [--bind ADDR:PORT]`: serve the artifact store to the boards over HTTPS (plain HTTP if deploy.tls: false),
and the fleet dashboard at /dashboard to the holder of the operator token (made here if missing)."""

from __future__ import annotations

import argparse

from edgetune.cli.common import add_fleet_argument
from edgetune.errors import DeployError
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve artifacts to the boards (HTTPS, per-board tokens, signed decisions)"
    )
    add_fleet_argument(parser)
    parser.add_argument("--bind", metavar="ADDR:PORT", help="listen here (default: deploy.bind of the fleet)")
    parser.set_defaults(func=drive_serve)


def drive_serve(args: argparse.Namespace) -> int:
    from edgetune.deploy.operator import ensure_operator_token
    from edgetune.deploy.server import serve
    from edgetune.report import DashboardCache

    fleet = load_fleet(args.fleet)
    host = port = None
    if args.bind:
        host, _, port_text = args.bind.rpartition(":")
        if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise DeployError(f"--bind {args.bind!r} is not ADDRESS:PORT, e.g. 127.0.0.1:8470")
        port = int(port_text)
    token, made = ensure_operator_token(fleet)
    print(f"dashboard: /dashboard with the operator token in {token}" + (" (made now)" if made else ""), flush=True)
    serve(fleet, host, port, dashboard=DashboardCache(fleet))
    return 0
