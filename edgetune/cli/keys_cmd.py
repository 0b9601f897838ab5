"""`edgetune keys init`: make the ed25519 key pair that signs artifact manifests and decisions,
the fleet CA and server certificate `edgetune serve` speaks HTTPS with (`deploy.tls`), and the operator
token that opens the server's dashboard."""

from __future__ import annotations

import argparse

from edgetune.artifact_format.signing import init_keys
from edgetune.cli.common import add_fleet_argument
from edgetune.deploy.operator import ensure_operator_token
from edgetune.deploy.tls import ensure_tls
from edgetune.inventory import load_fleet


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keys", help="manage the artifact signing key")
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init", help="make the signing key pair named by artifacts.signing_key / public_key, and beside it the "
        "fleet CA and the server certificate for deploy.url (these two whenever missing, even with --if-missing)"
    )
    add_fleet_argument(init)
    existing = init.add_mutually_exclusive_group()
    existing.add_argument("--force", action="store_true", help="replace an existing signing key")
    existing.add_argument(
        "--if-missing", action="store_true", help="keep an existing signing key and succeed (for scripts)"
    )
    init.set_defaults(func=drive_keys_init)


def drive_keys_init(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    settings = fleet.artifacts
    if args.if_missing and settings.signing_key.exists():
        print(f"keeping the existing signing key {settings.signing_key}")
    else:
        pair = init_keys(settings.signing_key, settings.public_key, settings.dir, force=args.force)
        print(f"signing key {pair.private_key} (mode 0600; keep it secret, keep it out of artifacts/)")
        print(f"public key  {pair.public_key} (key id {pair.key_id}; give it to whoever verifies)")
    for line in ensure_tls(fleet):
        print(line)
    if fleet.deploy is not None:
        token, made = ensure_operator_token(fleet)
        print(f"operator token {token} (mode 0600; opens the server's /dashboard)" + (" made" if made else " kept"))
    return 0
