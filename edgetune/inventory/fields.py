"""Checks of single inventory values, used as `rule(check=...)` in the schema (and on a pin's or
a label's key and value as the file writes them): each returns what is wrong with a value (the
message after `<file>: <path>: `), or None if it is fine."""

from __future__ import annotations

import ipaddress
import re

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERFACE = re.compile(r"[A-Za-z0-9_-]{1,15}")
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_LABEL_CHARS = 63
RESERVED_LABELS = ("class", "board")  # selector keys that name a board's device class and its name


def name_problem(value: str) -> str | None:
    if not _NAME.match(value) or len(value) > 128:
        return f"'{value[:130]}' is not a valid name (up to 128 letters, digits, '.', '_' and '-', starting with a letter or digit)"
    return None


def port_problem(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"must be a TCP port between 1 and 65535, got {value}"


def address_problem(value: str) -> str | None:
    """An IP address, or a host name. Names whose last label is a number are refused: they
    are mistyped IPv4 addresses (`999.1.1.1`), which resolvers would not look up as names."""
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", value):
        return f"'{value}' is not an IPv4 address (four numbers from 0 to 255, e.g. 10.0.0.7)"
    if not _HOSTNAME.match(value) or value.rsplit(".", 1)[-1].isdigit():
        return f"'{value}' is not an IP address or host name"
    return None


def ray_address_problem(value: str) -> str | None:
    """A Ray cluster's address: the head's HOST:PORT, or ray://HOST:PORT (Ray Client)."""
    host, colon, port = value.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        return f"'{value}' is not a Ray cluster address: HOST:PORT of the head (e.g. 10.0.0.5:6379) or ray://HOST:PORT"
    return address_problem(host) or port_problem(int(port))


def bind_problem(value: str) -> str | None:
    """ADDRESS:PORT a server listens on."""
    host, _, port = value.rpartition(":")
    if not host or not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        return f"'{value}' is not ADDRESS:PORT, e.g. 10.231.7.1:8470"
    return address_problem(host)


def url_problem(value: str) -> str | None:
    """The URL of a server, as boards reach it: scheme and host, no path."""
    if re.fullmatch(r"https?://[A-Za-z0-9.:\[\]-]+(:[0-9]{1,5})?/?", value):
        return None
    return f"'{value}' is not a server URL boards can reach, e.g. https://10.231.7.1:8470"


def env_name_problem(value: str) -> str | None:
    return None if _ENV_NAME.fullmatch(value) else f"'{value}' is not an environment variable name"


def interface_problem(value: str) -> str | None:
    return (
        None
        if _INTERFACE.fullmatch(value)
        else f"'{value}' is not a valid interface name (1-15 letters, digits, '-' or '_')"
    )


def host_interface_problem(value: str) -> str | None:
    """An IPv4 address with a prefix that leaves room for boards."""
    try:
        interface = ipaddress.IPv4Interface(value)
    except ValueError:
        return f"'{value}' is not an IPv4 address with prefix, e.g. 10.231.7.1/24"
    if interface.network.prefixlen == 32:
        return "needs a prefix length that leaves room for boards, e.g. /24"
    return None


def pin_problem(model: object, version: object) -> str | None:
    """A pin: a model name and the artifact version it is pinned to (the models are checked against
    the declared ones once all are read)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return f"must map a model name to an artifact version (an integer from 1), got {model!r}: {version!r}"
    return None


def label_key_problem(key: object) -> str | None:
    """A board label's name (`boards[].labels`, and the keys of a `--select`)."""
    if not isinstance(key, str):
        return f"label names are strings, got {type(key).__name__} {key!r}"
    problem = _label_problem(key, "name")
    if problem:
        return problem
    if key in RESERVED_LABELS:
        return f"'{key}' is not a label name: selectors use it for the board's {'device class' if key == 'class' else 'name'}"
    return None


def label_value_problem(value: object) -> str | None:
    """A board label's value: a short string (a YAML number or boolean must be quoted)."""
    if value is None:
        return "must be a string value, got nothing"
    if not isinstance(value, str):
        quoted = str(value).lower() if isinstance(value, bool) else str(value)
        return f"must be a string (quote it: '{quoted[:70]}'), got {type(value).__name__} {str(value)[:70]}"
    return _label_problem(value, "value")


def _label_problem(text: str, what: str) -> str | None:
    if len(text) > MAX_LABEL_CHARS:
        return f"'{text[:70]}{'...' if len(text) > 70 else ''}' is too long for a label {what} ({len(text)} characters, at most {MAX_LABEL_CHARS})"
    if not _LABEL.fullmatch(text):
        return (
            f"'{text}' is not a valid label {what} (1-{MAX_LABEL_CHARS} letters, digits, '.', '_' and '-', "
            "starting with a letter or digit)"
        )
    return None
