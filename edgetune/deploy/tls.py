"""The fleet's TLS: its own CA, the artifact server's certificate, and the host's client context.

`edgetune keys init` (and `tune-fleet`) call `ensure_tls`: a fleet CA (ECDSA P-256 key
`fleet-ca.key`, mode 0600, and a self-signed `fleet-ca.pem`) is made once (boards pin it);
the server's certificate (`server.pem`, key `server.key`, mode 0600) is made by that CA for the
hosts of `deploy.url` and `deploy.bind` (an IP address SAN for an address, a DNS SAN for a
name), valid `SERVER_DAYS`, and made again whenever those names change, it is not the CA's, or
less than `RENEW_SERVER_BELOW_DAYS` are left (`serve` renews it so while it runs). The rollout
copies `fleet-ca.pem` to every board, whose agent trusts no other authority for the server.
`keys rotate ca` makes a new CA (and server certificate); every CA the fleet had is kept in
`fleet-ca-history.pem`, so the rollout replaces a board's pin of an earlier one, and only that.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgetune.durable import write_atomic
from edgetune.errors import DeployError
from edgetune.inventory.schema import DeploySettings, Fleet, TlsFiles

CA_DAYS = 3650
SERVER_DAYS = 7  # short-lived: a stolen server key serves for days at most
RENEW_SERVER_BELOW_DAYS = 3.5
KEYS_INIT = "run `edgetune keys init --if-missing -f {fleet}`"
_UNSPECIFIED = {"0.0.0.0", "::"}


def server_names(deploy: DeploySettings) -> tuple[str, ...]:
    """The hosts the server's certificate must name: deploy.url's, then deploy.bind's."""
    names = [urlsplit(deploy.url).hostname or "", deploy.bind_host]
    return tuple(dict.fromkeys(n for n in names if n and n not in _UNSPECIFIED))


def ensure_tls(fleet: Fleet) -> list[str]:
    """Make what is missing of the fleet CA and the server certificate; what was done, as lines."""
    if fleet.deploy is None or fleet.deploy.tls is None:
        return []
    files, names = fleet.deploy.tls, server_names(fleet.deploy)
    done = []
    if not files.ca_cert.exists() or not files.ca_key.exists():
        _make_ca(files, fleet.name)
        done.append(f"fleet CA {files.ca_cert} (key {files.ca_key}, mode 0600): the rollout pins it on every board")
    ca_cert, ca_key = _load_ca(files)
    problem = server_certificate_problem(files, names, ca_cert)
    if problem:
        _make_server_certificate(files, names, ca_cert, ca_key)
        done.append(f"server certificate {files.server_cert} for {', '.join(names)} ({problem})")
    else:
        done.append(f"keeping the fleet CA {files.ca_cert} and the server certificate for {', '.join(names)}")
    return done


def server_certificate_problem(files: TlsFiles, names: tuple[str, ...], ca_cert: x509.Certificate) -> str | None:
    """None if the server certificate is the CA's, current, and names every one of `names`."""
    try:
        cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
        files.server_key.stat()
    except FileNotFoundError:
        return "there was none"
    except (OSError, ValueError) as err:
        return f"the one there was unreadable: {err}"
    try:
        ca_cert.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    except (InvalidSignature, TypeError):
        return "the one there was not signed by this CA"
    if cert.not_valid_after_utc < _now() + datetime.timedelta(days=RENEW_SERVER_BELOW_DAYS):
        return f"the one there expires within {RENEW_SERVER_BELOW_DAYS:g} days"
    missing = [n for n in names if n not in _names_of(cert)]
    return f"the one there did not name {', '.join(missing)}" if missing else None


def renew_server_certificate(fleet: Fleet) -> str | None:
    """For `serve`: a new server certificate when the one there is due (less than
    RENEW_SERVER_BELOW_DAYS left, other names, another CA's): why it was made, or None."""
    files = _tls_files(fleet)
    names = server_names(fleet.deploy)
    ca_cert, ca_key = _load_ca(files)
    problem = server_certificate_problem(files, names, ca_cert)
    if problem:
        _make_server_certificate(files, names, ca_cert, ca_key)
    return problem


def rotate_server(fleet: Fleet) -> str:
    """A new server key and certificate, now (the old key is worthless once `serve` restarted)."""
    files, names = _tls_files(fleet), server_names(fleet.deploy)
    ca_cert, ca_key = _load_ca(files)
    _make_server_certificate(files, names, ca_cert, ca_key)
    return f"new server key and certificate {files.server_cert} for {', '.join(names)} (restart `serve`)"


def rotate_ca(fleet: Fleet) -> str:
    """A new fleet CA and a server certificate made by it; the old CA stays in the history, so
    the next rollout replaces it on every board it reaches."""
    files = _tls_files(fleet)
    _load_ca(files)
    _append_history(files)
    _make_ca(files, fleet.name)
    _append_history(files)
    ca_cert, ca_key = _load_ca(files)
    _make_server_certificate(files, server_names(fleet.deploy), ca_cert, ca_key)
    return (
        f"new fleet CA {files.ca_cert} and server certificate: restart `serve`, then roll out (boards reached "
        "over SSH take the new CA; until then they cannot reach the server)"
    )


def ca_history_file(files: TlsFiles) -> Path:
    return files.ca_cert.with_name("fleet-ca-history.pem")


def is_fleet_ca(fleet: Fleet, pem: bytes) -> bool:
    """Every certificate in `pem` (a board's pinned CA) is a CA this fleet has had."""
    files = _tls_files(fleet)
    known = {_fingerprint(c) for c in _certificates(files.ca_cert)}
    known |= {_fingerprint(c) for c in _certificates(ca_history_file(files))}
    try:
        pinned = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return False
    return bool(pinned) and all(_fingerprint(c) in known for c in pinned)


def _append_history(files: TlsFiles) -> None:
    history = ca_history_file(files)
    certs = _certificates(history)
    current = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    if _fingerprint(current) not in {_fingerprint(c) for c in certs}:
        certs.append(current)
        write_atomic(history, b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs), mode=0o644)


def _certificates(path: Path) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return []


def _fingerprint(cert: x509.Certificate) -> bytes:
    return cert.fingerprint(hashes.SHA256())


def _tls_files(fleet: Fleet) -> TlsFiles:
    if fleet.deploy is None or fleet.deploy.tls is None:
        raise DeployError(
            f"{fleet.path}: the fleet serves without TLS (deploy.tls: false): there is no CA or server key"
        )
    return fleet.deploy.tls


def check_server_tls(fleet: Fleet) -> dict[str, str]:
    """uvicorn's TLS options for `edgetune serve` ({} for plain HTTP); refuses a certificate
    that is missing, not the fleet CA's, or does not name the server's hosts."""
    files = fleet.deploy.tls
    if files is None:
        return {}
    try:
        ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    except (OSError, ValueError) as err:
        raise DeployError(
            f"the fleet CA {files.ca_cert} cannot be read ({err}): {KEYS_INIT.format(fleet=fleet.path)}"
        ) from None
    problem = server_certificate_problem(files, server_names(fleet.deploy), ca_cert)
    if problem:
        raise DeployError(
            f"the server certificate {files.server_cert} cannot be used ({problem}): "
            + KEYS_INIT.format(fleet=fleet.path)
        )
    return {"ssl_certfile": str(files.server_cert), "ssl_keyfile": str(files.server_key)}


def host_client_context(fleet: Fleet) -> ssl.SSLContext | None:
    """How the host (rollout, tests) reaches its own server: only the fleet CA is trusted."""
    if fleet.deploy is None or fleet.deploy.tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=str(fleet.deploy.tls.ca_cert))
    except (OSError, ssl.SSLError) as err:
        raise DeployError(
            f"the fleet CA {fleet.deploy.tls.ca_cert} cannot be read ({err}): " + KEYS_INIT.format(fleet=fleet.path)
        ) from None
    return context


def _make_ca(files: TlsFiles, fleet_name: str) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"edgetune fleet CA ({fleet_name})"[:64])])
    cert = (
        _builder(name, name, key.public_key(), CA_DAYS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(files.ca_key, key, files.ca_cert, cert)


def _make_server_certificate(files: TlsFiles, names: tuple[str, ...], ca_cert: x509.Certificate, ca_key) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), SERVER_DAYS)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_pair(files.server_key, key, files.server_cert, cert)


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    start = _now() - datetime.timedelta(minutes=5)  # a board whose clock is a little behind
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _names_of(cert: x509.Certificate) -> set[str]:
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in names.get_values_for_type(x509.IPAddress)} | set(names.get_values_for_type(x509.DNSName))


def _load_ca(files: TlsFiles):
    try:
        cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
    except (OSError, ValueError) as err:
        raise DeployError(
            f"the fleet CA {files.ca_cert} / {files.ca_key} cannot be used ({err}); boards pin it, so "
            "restore it from a backup (or remove both and roll out again to every board)"
        ) from None
    return cert, key


def _write_pair(key_path: Path, key, cert_path: Path, cert: x509.Certificate) -> None:
    key_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_atomic(key_path, pem, mode=0o600)
    write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)
