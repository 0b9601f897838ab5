"""`edgetune keys`: the fleet's keys by role (docs/keys.md). `init` makes what is missing: the
artifact key (offline: signs manifests, the index and the trust file), the decision key `serve`
signs decisions with and its certificate (`deploy.keys`), the fleet CA and the server's
certificate (`deploy.tls`), and the operator token; `rotate` replaces one key, `revoke` refuses
one from a time on, `list` shows them."""

from __future__ import annotations

import argparse
import time

from edgetune.artifact_format.signing import init_keys, key_id
from edgetune.artifact_format.trust import DECISION, artifact_history, read_revocations, read_statement
from edgetune.cli.common import add_fleet_argument
from edgetune.deploy.keys import DAY_S, KeyFiles, OfflineKeys
from edgetune.deploy.operator import ensure_operator_token
from edgetune.deploy.tls import ensure_tls, rotate_ca, rotate_server
from edgetune.errors import DeployError
from edgetune.inventory import load_fleet

ROLES = ("artifact", "decision", "ca", "server")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keys", help="manage the fleet's keys (artifact, decision, CA, server)")
    actions = parser.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init",
        help="make the signing key pair named by artifacts.signing_key / public_key, and beside it the "
        "decision key and trust file, the fleet CA and the server certificate for deploy.url (these whenever "
        "missing or due, even with --if-missing)",
    )
    add_fleet_argument(init)
    existing = init.add_mutually_exclusive_group()
    existing.add_argument(
        "--force",
        action="store_true",
        help="replace an existing signing key (boards pinning it will refuse the new one: rotate instead)",
    )
    existing.add_argument(
        "--if-missing", action="store_true", help="keep an existing signing key and succeed (for scripts)"
    )
    init.set_defaults(func=drive_keys_init)

    rotate = actions.add_parser(
        "rotate", help="replace one key; boards take the new one at their next download or rollout (docs/keys.md)"
    )
    rotate.add_argument(
        "role",
        choices=ROLES,
        help="artifact (offline signing key), decision (serve's), ca (the fleet CA), server (the TLS key)",
    )
    add_fleet_argument(rotate)
    rotate.add_argument(
        "--refuse-old-in",
        type=_days,
        metavar="DAYS",
        default=None,
        help="artifact/decision: refuse the old key's signatures DAYS from now (decision: default "
        "0, at once; artifact: default never, the old key stays good for what it signed)",
    )
    rotate.set_defaults(func=drive_keys_rotate)

    revoke = actions.add_parser("revoke", help="refuse a key's signatures on every board from a time on")
    revoke.add_argument("key_id", help="the key id (`edgetune keys list`)")
    add_fleet_argument(revoke)
    revoke.add_argument(
        "--in", dest="days", type=_days, default=0.0, metavar="DAYS", help="refuse it DAYS from now (default: at once)"
    )
    revoke.set_defaults(func=drive_keys_revoke)

    listing = actions.add_parser("list", help="the artifact key's history, the decision key and the revocations")
    add_fleet_argument(listing)
    listing.set_defaults(func=drive_keys_list)


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 0 <= days <= 3650:
        raise argparse.ArgumentTypeError(f"{text} days: allowed 0 to 3650")
    return days


def drive_keys_init(args: argparse.Namespace) -> int:
    fleet = load_fleet(args.fleet)
    settings = fleet.artifacts
    if args.if_missing and settings.signing_key.exists():
        print(f"keeping the existing signing key {settings.signing_key}")
    else:
        pair = init_keys(settings.signing_key, settings.public_key, settings.dir, force=args.force)
        KeyFiles.of(fleet).trust.unlink(missing_ok=True)  # a new anchor: a new history
        print(
            f"signing key {pair.private_key} (mode 0600; keep it secret, keep it out of artifacts/ and off the server)"
        )
        print(f"public key  {pair.public_key} (key id {pair.key_id}; give it to whoever verifies)")
    print(OfflineKeys(fleet).ensure_decision_key(time.time()))
    for line in ensure_tls(fleet):
        print(line)
    if fleet.deploy is not None:
        token, made = ensure_operator_token(fleet)
        print(f"operator token {token} (mode 0600; opens the server's /dashboard)" + (" made" if made else " kept"))
    return 0


def drive_keys_rotate(args: argparse.Namespace) -> int:
    fleet, now = load_fleet(args.fleet), time.time()
    if args.role in ("ca", "server"):
        if args.refuse_old_in is not None:
            raise DeployError(f"--refuse-old-in is for the artifact and decision keys, not {args.role}")
        print(rotate_ca(fleet) if args.role == "ca" else rotate_server(fleet))
        return 0
    keys = OfflineKeys(fleet)
    if args.role == "decision":
        lines = keys.rotate_decision(now, now + (args.refuse_old_in or 0.0) * DAY_S)
    else:
        refuse = None if args.refuse_old_in is None else now + args.refuse_old_in * DAY_S
        lines = keys.rotate_artifact(now, refuse)
    for line in lines:
        print(line)
    return 0


def drive_keys_revoke(args: argparse.Namespace) -> int:
    now = time.time()
    print(OfflineKeys(load_fleet(args.fleet)).revoke(args.key_id, now + args.days * DAY_S, now))
    return 0


def drive_keys_list(args: argparse.Namespace) -> int:
    trust = OfflineKeys(load_fleet(args.fleet)).trust
    history = artifact_history(trust)
    for i, key in enumerate(history):
        role = "anchor (pinned on boards)" if i == 0 else f"rotation {i}"
        print(f"artifact {key_id(key)}  {role}{'  newest' if i == len(history) - 1 else ''}")
    if trust.decision is not None:
        cert = read_statement(trust.decision, history[-1], DECISION, "decision")
        print(f"decision {cert.key_id}  certified {cert.issued} until {cert.expires}")
    if trust.revocations is not None:
        revocations = read_revocations(trust.revocations, history[-1])
        for entry in revocations.revoked:
            print(f"revoked  {entry.key_id}  from {entry.refused_from}")
    return 0
