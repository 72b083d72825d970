"""Where the gateway may send requests when an admin names a backend: SSRF rules, applied once.

A backend URL is checked in this order, and refused at the first rule it breaks:

1. Shape: `http` or `https`, a host, no credentials (`user:pass@`), no query or fragment, only
   printable ASCII (no spaces, tabs or backslashes that parsers disagree about).
2. The host, if it is an IP literal, must be written canonically: dotted-quad IPv4 or bracketed
   IPv6. Decimal (`2852039166`), octal (`0251.0376.0251.0376`), hex (`0xa9fea9fe`) and short
   (`127.1`) forms are refused outright, because resolvers read them differently. An IPv4-mapped
   IPv6 address (`[::ffff:169.254.169.254]`) is judged as the IPv4 address it maps.
3. The name is resolved once (`resolve_host`). Every address it resolves to must pass, and the
   first one is the address that is connected to (`PinnedTarget`): the request goes to that IP
   with the original `Host` header (and the original name as TLS SNI), so a second, different
   DNS answer cannot redirect it.
4. An address passes when it lies in a network of the allowlist (`RLGW_BACKEND_ALLOWLIST`,
   default loopback only), or when the name itself is listed. The unspecified address
   (`0.0.0.0`, `::`), multicast, broadcast and reserved addresses never pass. Link-local and
   metadata addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254, 100.100.100.200) and prefixes
   that embed IPv4 addresses (NAT64, 6to4, Teredo) pass only through a network entry that lies
   inside them: a broad entry such as `0.0.0.0/0` or a listed host name does not unlock them.

Redirects are never followed (a 3xx answer is a failed check), proxies from the environment are
ignored, and timeouts are short.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2048
_SAFE_URL_CHARS = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_-]{1,63})*$"
)
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")

# Never a backend, whatever the allowlist says.
_NEVER = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network": 0.0.0.0 reaches the local host on Linux
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255 broadcast
        "::/128",  # unspecified
        "ff00::/8",  # multicast
    )
)
# Allowed only through a network entry that lies inside them.
SPECIAL = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",  # link-local, cloud metadata at 169.254.169.254
        "100.100.100.200/32",  # a cloud metadata address outside link-local
        "fe80::/10",  # IPv6 link-local
        "fd00:ec2::254/128",  # cloud metadata over IPv6
        "64:ff9b::/96",  # NAT64: embeds an IPv4 address
        "2002::/16",  # 6to4: embeds an IPv4 address
        "2001::/32",  # Teredo: embeds an IPv4 address
    )
)


class TargetRefused(ValueError):
    """The URL may not be used as a backend; the message says which rule it broke."""


@dataclass(frozen=True)
class Allowlist:
    networks: tuple[IPNetwork, ...]
    hosts: frozenset[str]

    def describe(self) -> str:
        return ", ".join([*(str(n) for n in self.networks), *sorted(self.hosts)]) or "(empty)"


def parse_allowlist(text: str) -> Allowlist:
    """Comma- or space-separated networks (`10.0.0.0/8`, `192.168.1.7`, `::1`) and host names."""
    networks: list[IPNetwork] = []
    hosts: set[str] = set()
    for entry in re.split(r"[,\s]+", text.strip()):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=True))
            continue
        except ValueError as exc:
            if "/" in entry or ":" in entry or _looks_numeric(entry.lower()):
                raise ValueError(
                    f"allowlist entry {entry!r} is not a valid network: {exc}"
                ) from None
        name = entry.lower().rstrip(".")
        if not _HOSTNAME.match(name):
            raise ValueError(f"allowlist entry {entry!r} is neither a network nor a host name")
        hosts.add(name)
    return Allowlist(tuple(networks), frozenset(hosts))


def _looks_numeric(host: str) -> bool:
    """WHATWG URL rule: a host whose last label is a number is an IPv4 address, not a name."""
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return bool(_NUMERIC_LABEL.match(last))


def _unmap(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def ip_literal(host: str) -> IPAddress | None:
    """The address an IP-literal host names (canonical forms only), or None for a DNS name."""
    if ":" in host:
        if "%" in host:
            raise TargetRefused("IPv6 zone identifiers are refused")
        try:
            return _unmap(ipaddress.IPv6Address(host))
        except ValueError:
            raise TargetRefused("malformed IPv6 address") from None
    if _looks_numeric(host):
        try:
            return ipaddress.IPv4Address(host)  # dotted quad, no leading zeros
        except ValueError:
            raise TargetRefused(
                "non-canonical IPv4 address (decimal, octal, hex and short forms are refused)"
            ) from None
    return None


def resolve_host(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order (tests replace this)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    seen: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.append(sockaddr[0])
    return seen


def address_problem(ip: IPAddress, allow: Allowlist, *, host_listed: bool = False) -> str | None:
    """Why `ip` may not be a backend address, or None if it may."""
    ip = _unmap(ip)
    if any(ip.version == n.version and ip in n for n in _NEVER):
        return f"{ip} is an unspecified, multicast or reserved address"
    covering = [n for n in allow.networks if n.version == ip.version and ip in n]
    special = next((s for s in SPECIAL if s.version == ip.version and ip in s), None)
    if special is not None:
        if any(n.subnet_of(special) for n in covering):  # type: ignore[arg-type]
            return None
        return (
            f"{ip} is a link-local, metadata or IPv4-embedding address: allowlist a network "
            f"inside {special} to permit it"
        )
    if covering or host_listed:
        return None
    return f"{ip} is not in RLGW_BACKEND_ALLOWLIST ({allow.describe()})"


@dataclass(frozen=True)
class PinnedTarget:
    """A checked backend URL and the one address every request to it is sent to."""

    url: str  # as registered, without a trailing slash: what is stored
    scheme: str
    host: str  # name or IP as written, lower case, without brackets
    port: int
    path: str  # prefix before /v1/..., no trailing slash
    address: str  # the resolved address connected to

    def request_url(self, path: str) -> str:
        ip = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{ip}:{self.port}{self.path}{path}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = {"http": 80, "https": 443}[self.scheme]
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def extensions(self) -> dict[str, str]:
        # TLS: present and verify the certificate for the name, not for the pinned IP.
        if self.scheme == "https" and ip_literal(self.host) is None:
            return {"sni_hostname": self.host}
        return {}


def check_backend_url(url: str, allow: Allowlist | None, *, resolver=None) -> PinnedTarget:
    """Check `url` against the rules above and pin its address. `allow=None` skips only the
    allowlist (rule 4's network test), for an operator who says so explicitly; the shape rules,
    the never-allowed addresses and the pinning still apply."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"a backend URL must be 1-{MAX_URL_LENGTH} characters")
    if not _SAFE_URL_CHARS.match(url) or "\\" in url:
        raise TargetRefused("a backend URL must be printable ASCII without spaces or backslashes")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TargetRefused("only http and https backend URLs are accepted")
    if "@" in parts.netloc:
        raise TargetRefused("credentials in a backend URL are refused")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise TargetRefused("a backend URL may not have a query or a fragment")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise TargetRefused("a backend URL needs a host")
    try:
        port = parts.port or {"http": 80, "https": 443}[scheme]
    except ValueError:
        raise TargetRefused("invalid port") from None
    path = parts.path.rstrip("/")
    if "%" in path or "/../" in f"{path}/" or "/./" in f"{path}/":
        raise TargetRefused("a backend URL path may not contain dot segments or escapes")
    literal = ip_literal(host)
    listed = literal is None and allow is not None and host in allow.hosts
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        if not _HOSTNAME.match(host):
            raise TargetRefused("invalid host name")
        try:
            answers = resolver(host, port) if resolver else resolve_host(host, port)
        except (OSError, UnicodeError) as exc:
            raise TargetRefused(f"cannot resolve {host}: {type(exc).__name__}") from None
        try:
            addresses = [_unmap(ipaddress.ip_address(a.split("%", 1)[0])) for a in answers]
        except ValueError:
            raise TargetRefused(f"{host} resolved to a malformed address") from None
        if not addresses:
            raise TargetRefused(f"{host} resolved to no address")
    check = allow if allow is not None else Allowlist((), frozenset())
    for ip in addresses:
        problem = address_problem(ip, check, host_listed=listed or allow is None)
        if problem:
            raise TargetRefused(f"{host} -> {problem}" if literal is None else problem)
    return PinnedTarget(
        url=url.rstrip("/"),
        scheme=scheme,
        host=host,
        port=port,
        path=path,
        address=str(addresses[0]),
    )
