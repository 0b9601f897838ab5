"""ed25519 signing of manifests with the `cryptography` package.

Keys: the private key is PKCS#8 PEM (unencrypted, mode 0600, in a 0700 directory, never under
the artifacts directory); the public key is SubjectPublicKeyInfo PEM.

Signature file (`manifest.sig`), canonical JSON:
`{"algorithm": "ed25519", "key_id": <first 16 hex of sha256(raw public key)>, "signature": <base64>}`.
The signature covers the exact bytes of `manifest.json`. `key_id` only serves to tell "signed by
another key" from "modified after signing" in error messages; trust comes from the signature.
The store's `index.sig` is the same format, over the bytes of `index.json`.
"""

from __future__ import annotations

import base64
import binascii
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgetune.artifact_format.codec import canonical_bytes, from_json, load_json, sha256_hex
from edgetune.durable import write_atomic
from edgetune.errors import ArtifactError

ALGORITHM = "ed25519"
KEYS_INIT_HINT = "run `edgetune keys init`"
MAX_SIGNATURE_BYTES = 64 << 10  # a signature file is about 150 bytes


@dataclass(frozen=True)
class Signature:
    algorithm: str
    key_id: str
    signature: str  # base64

    def to_bytes(self) -> bytes:
        return canonical_bytes(self)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Signature:
        raw = load_json(data, where)
        try:
            sig = from_json(cls, raw)
        except ArtifactError as err:
            raise ArtifactError(f"{where}: not a signature file ({err})") from None
        if sig.algorithm != ALGORITHM:
            raise ArtifactError(f"{where}: algorithm {sig.algorithm!r} is not {ALGORITHM}")
        return sig


@dataclass(frozen=True)
class KeyPair:
    private_key: Path
    public_key: Path
    key_id: str


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)[:16]


def init_keys(private_path: Path, public_path: Path, artifacts_dir: Path, force: bool = False) -> KeyPair:
    """Make a new key pair. Refuses a private key under `artifacts_dir` (it would be shipped),
    and an existing private key unless `force` (a new key cannot verify old artifacts)."""
    private_path, public_path = Path(private_path).absolute(), Path(public_path).absolute()
    if private_path.resolve() == public_path.resolve():
        raise ArtifactError(
            f"the signing key and the public key are the same file ({private_path}): writing the public "
            "key would destroy the private one; give artifacts.public_key its own file"
        )
    if _is_within(private_path, Path(artifacts_dir).absolute()):
        raise ArtifactError(
            f"the signing key {private_path} is inside the artifacts directory {artifacts_dir}: "
            "put artifacts.signing_key outside it in the fleet file"
        )
    if private_path.exists() and not force:
        raise ArtifactError(
            f"a signing key already exists at {private_path}; keep it (artifacts signed with it "
            "verify only with its public key) or pass --force to replace it"
        )
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(private_path, pem, mode=0o600)
    write_atomic(public_path, public_pem, mode=0o644)
    return KeyPair(private_path, public_path, key_id(key.public_key()))


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The signing key; a clear error if it is missing, readable by others, or not ed25519."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"no signing key at {path}: {KEYS_INIT_HINT}") from None
    except OSError as err:
        raise ArtifactError(f"cannot read the signing key {path}: {err.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ArtifactError(f"the signing key {path} is readable by others: chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise ArtifactError(f"{path} is not a usable PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ArtifactError(f"{path} is not an ed25519 key: {KEYS_INIT_HINT}")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"no public key at {path}: pass --public-key, or {KEYS_INIT_HINT}") from None
    except OSError as err:
        raise ArtifactError(f"cannot read the public key {path}: {err.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as err:
        raise ArtifactError(f"{path} is not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ArtifactError(f"{path} is not an ed25519 public key")
    return key


def public_key_id(pem: bytes) -> str | None:
    """The key id of a PEM ed25519 public key; None if `pem` is not one."""
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        return None
    return key_id(key) if isinstance(key, Ed25519PublicKey) else None


def sign(private_key: Ed25519PrivateKey, data: bytes) -> Signature:
    return Signature(
        algorithm=ALGORITHM,
        key_id=key_id(private_key.public_key()),
        signature=base64.b64encode(private_key.sign(data)).decode("ascii"),
    )


PublicKeys = Ed25519PublicKey | tuple[Ed25519PublicKey, ...]


def signature_problem(public_key: PublicKeys, data: bytes, sig: Signature, signed: str = "manifest") -> str | None:
    """None if `sig` is a valid signature of `data` (a `signed`) by `public_key` (or by one of
    a tuple of keys: the one `sig.key_id` names), else what is wrong."""
    keys = public_key if isinstance(public_key, tuple) else (public_key,)
    by_id = {key_id(key): key for key in keys}
    if sig.key_id not in by_id:
        given = ", ".join(by_id) or "none"
        return (
            f"signed by key {sig.key_id}, but the public key given is {given} "
            "(wrong public key, or an artifact from another signer)"
        )
    try:
        by_id[sig.key_id].verify(base64.b64decode(sig.signature, validate=True), data)
    except (InvalidSignature, binascii.Error, ValueError):
        return f"signature does not match the {signed}'s bytes (the {signed} was modified after signing)"
    return None


def signature_file_problems(
    public_key: PublicKeys, data: bytes, sig_bytes: bytes, signed_name: str, sig_name: str
) -> list[str]:
    """What is wrong with the signature file `sig_name` (bytes `sig_bytes`) as a signature of
    `signed_name` (bytes `data`) by `public_key`; empty if it is valid."""
    try:
        sig = Signature.from_bytes(sig_bytes, sig_name)
    except ArtifactError as err:
        return [str(err)]
    problem = signature_problem(public_key, data, sig)
    return [f"{signed_name}: {problem}"] if problem else []


def _is_within(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())
