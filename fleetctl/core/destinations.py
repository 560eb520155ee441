"""Where fleetctl may connect when a person or a token gave it the address.

Webhook receivers, pool endpoints and gateway admin URLs are typed in by people (or sent by
automation with a `fleet` token). Unchecked, such an address reaches what only fleetctl's
own host should: a gateway's admin API on loopback (`/runtime_modify`, `/quitquitquit`), Redis,
the web's own API, a cloud's metadata service. This module decides, once for every caller:

- **Spelling.** An IP address is written the standard way: `127.1`, `2130706433`, `0x7f.1`,
  `0177.0.0.1` and `[::ffff:127.0.0.1]` all reach 127.0.0.1, and are refused with the
  standard spelling to use instead, so that two spellings never hide one server.
- **What a name resolves to, every address of it**: loopback, this host's own addresses,
  "unspecified" (0.0.0.0, which connects to this host), link-local, cloud metadata,
  multicast, broadcast and reserved ranges are refused, also when an IPv6 address carries
  one of them inside (IPv4-mapped, NAT64, 6to4) -- unless an administrator allow-lists a
  network for that purpose in settings (`OUTBOUND_ALLOW_<PURPOSE>`, e.g. the demo's pools on
  127.0.0.0/8). Private ranges (10/8, 192.168/16, fc00::/7...) are where fleets live and are
  allowed.
- **The product's own services** (Redis, the database, the web server, the shadow collector,
  every registered gateway's admin API, anything in `OUTBOUND_DENY`) are refused for every
  purpose, allow-list or not.

`destination_check` resolves the name once; `destination_request` connects to exactly the
addresses that were checked (a name that resolves elsewhere a moment later -- DNS rebinding --
changes nothing). `same_server_keys` is the residency side of the same facts: what an
endpoint URL connects to, so that two spellings of one server compare equal (all loopback
and local addresses are one host).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from fleetctl.core.http import (
    OutboundError,
    OutboundResponse,
    OutboundUnreachable,
    shared_client,
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Purposes: who gave the address, and so which allow-list applies.
POOLS = "pools"
GATEWAYS = "gateways"
WEBHOOKS = "webhooks"
# Metric sources (a Prometheus, an HTTP JSON endpoint) an administrator registers: their own
# allow-list, so a loopback Prometheus allowed here opens nothing for webhooks or pools.
METRICS = "metrics"
PURPOSES = (POOLS, GATEWAYS, WEBHOOKS, METRICS)

# Refused for every purpose unless allow-listed; the first match names the reason. Metadata
# addresses come before the ranges that hold them, so the message says what they are.
_REFUSED: list[tuple[Network, str]] = [(ipaddress.ip_network(net), why) for net, why in (
    ("169.254.169.254/32", "a cloud metadata service"),
    ("fd00:ec2::254/128", "a cloud metadata service"),
    ("100.100.100.200/32", "a cloud metadata service"),
    ("168.63.129.16/32", "a cloud platform service (Azure's wire server)"),
    ("0.0.0.0/8", "'this network' (0.0.0.0 connects to this host)"),
    ("::/128", "unspecified (:: connects to this host)"),
    ("127.0.0.0/8", "loopback (this host)"),
    ("::1/128", "loopback (this host)"),
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("224.0.0.0/4", "multicast"),
    ("ff00::/8", "multicast"),
    ("255.255.255.255/32", "broadcast"),
    ("240.0.0.0/4", "reserved"),
    ("100::/64", "a discard-only range"),
)]


class DestinationRefused(OutboundError):
    """A user-given address fleetctl will not connect to. The message says why and what to
    write instead; retrying cannot help (`permanent`)."""

    permanent = True


class DestinationUnresolved(DestinationRefused):
    """The name does not resolve (now): nothing can be checked, so nothing is sent."""


@dataclass(frozen=True)
class Destination:
    """A checked URL: the host as given (for the Host header and TLS) and every address it
    resolved to, each allowed. Connect to these, not to the name again."""

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


# --- spelling ------------------------------------------------------------------------------------

_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)


def host_spelling_problem(host: str) -> str | None:
    """Why `host` (as urlsplit gives it: no brackets, any case) is not a standard spelling,
    or None. IPv4 must be dotted decimal without leading zeros; an IPv6 literal must not be
    an IPv4 address in disguise nor carry a zone; a name's last label is never numeric (a
    resolver would read the whole name as an IPv4 address in some legacy form)."""
    if not host:
        return "it has no host"
    if ":" in host:
        if "%" in host:
            return f"[{host}] carries a zone (%...); give the address without it"
        try:
            v6 = ipaddress.IPv6Address(host)
        except ValueError:
            return f"[{host}] is not an IPv6 address"
        if v6.ipv4_mapped is not None:
            return (f"[{host}] is the IPv4 address {v6.ipv4_mapped} written as IPv6; "
                    f"write {v6.ipv4_mapped}")
        return None
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    last = host.rstrip(".").rsplit(".", 1)[-1]
    if _NUMERIC_LABEL.match(last):
        try:
            standard = socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return f"{host!r} is neither a host name nor an IPv4 address"
        return f"{host!r} is a non-standard spelling of {standard}; write {standard}"
    return None


def _plain(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """IPv4 addresses an IPv6 address carries and may reach (mapped, NAT64, 6to4,
    IPv4-compatible): each is checked as well."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    found = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    packed = address.packed
    if address in ipaddress.ip_network("64:ff9b::/96") or (
            packed[:12] == bytes(12) and packed[12:] != bytes(4) and int(address) > 1):
        found.append(ipaddress.IPv4Address(packed[12:]))
    return found


# --- this host -----------------------------------------------------------------------------------

@lru_cache(maxsize=4096)
def is_this_host(address: IPAddress) -> bool:
    """Loopback, unspecified, or an address of one of this host's interfaces (found by
    binding a socket to it: only a local address can be bound). A server listening on all
    interfaces answers on every one of them, so they are one host."""
    address = _plain(address)
    if address.is_loopback or address.is_unspecified:
        return True
    if address.is_multicast or (isinstance(address, ipaddress.IPv6Address)
                                and address.is_link_local):
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(address), 0))
        return True
    except OSError:
        return False


def same_server_key(address: IPAddress, port: int) -> tuple[str, int]:
    """One key per server: every address of this host is the same host."""
    address = _plain(address)
    return ("this-host" if is_this_host(address) else str(address), port)


# --- resolution ----------------------------------------------------------------------------------

def _url_parts(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise DestinationRefused(f"{url!r} is not an http:// or https:// URL with a host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise DestinationRefused(f"{url!r} has an invalid port") from exc
    return scheme, parts.hostname.lower(), port


# Answers of the resolver, kept briefly: a registry check compares one pool's endpoints with
# every other pool's, and a name that does not resolve can take the resolver tens of
# milliseconds to say so. Connections still go to the addresses a check returned, so a kept
# answer never lets a request reach an address that was not checked.
LOOKUP_TTL_S = 30.0
_LOOKUP_MAX = 4096
_lookups: dict[tuple[str, int], tuple[float, list[Any] | str]] = {}
_lookups_lock = threading.Lock()


def _lookup(host: str, port: int) -> list[Any] | str:
    """getaddrinfo's answer for (host, port), or its error as text, kept LOOKUP_TTL_S."""
    now = time.monotonic()
    with _lookups_lock:
        kept = _lookups.get((host, port))
    if kept is not None and now - kept[0] < LOOKUP_TTL_S:
        return kept[1]
    answer: list[Any] | str
    try:
        answer = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        answer = str(exc)
    with _lookups_lock:
        if len(_lookups) >= _LOOKUP_MAX:
            _lookups.clear()
        _lookups[(host, port)] = (now, answer)
    return answer


def resolve(host: str, port: int) -> tuple[IPAddress, ...]:
    """Every address `host` stands for (a literal: itself), IPv4-mapped ones as IPv4, in the
    resolver's order, each once. DestinationUnresolved when the name does not resolve."""
    problem = host_spelling_problem(host)
    if problem:
        raise DestinationRefused(problem)
    try:
        return (_plain(ipaddress.ip_address(host)),)
    except ValueError:
        pass
    infos = _lookup(host, port)
    if isinstance(infos, str):
        raise DestinationUnresolved(f"{host} does not resolve ({infos})")
    found: list[IPAddress] = []
    for family, *_rest, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = _plain(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
        if address not in found:
            found.append(address)
    if not found:
        raise DestinationUnresolved(f"{host} resolves to no IP address")
    return tuple(found)


def same_server_keys(url: str) -> frozenset[tuple[str, int]]:
    """What a URL connects to, as same_server_key()s: two URLs share a key exactly when they
    may reach the same server (scheme and path do not matter; a host name counts as each of
    its addresses). Raises DestinationRefused (a non-standard spelling) or
    DestinationUnresolved."""
    _, host, port = _url_parts(url)
    return frozenset(same_server_key(address, port) for address in resolve(host, port))


# --- policy --------------------------------------------------------------------------------------

# Providers of the product's own services, as URLs or host:port: settings-based ones are
# below, others (registered gateways' admin APIs) are added by their apps' ready(). Each has
# a label; a purpose may be exempt from a label (a gateway's own admin URL is a gateway's).
_providers: list[tuple[str, Callable[[], Iterable[str]]]] = []
_providers_lock = threading.Lock()
_EXEMPT = {GATEWAYS: {"a registered gateway's admin API"}}


def own_services_register(label: str, provider: Callable[[], Iterable[str]]) -> None:
    """Add a source of the product's own addresses (e.g. in an AppConfig.ready())."""
    with _providers_lock:
        if all(existing is not provider for _, existing in _providers):
            _providers.append((label, provider))


def _settings_services() -> list[tuple[str, str]]:
    from django.conf import settings

    found = [("Redis (the broker and cache)", settings.REDIS_URL),
             ("the shadow collector", settings.SHADOW_COLLECTOR_URL)]
    db = settings.DATABASES["default"]
    if db.get("HOST"):
        found.append(("the database", f"{db['HOST']}:{db.get('PORT') or 5432}"))
    found += [("a service of this deployment (OUTBOUND_DENY)", item)
              for item in getattr(settings, "OUTBOUND_DENY", [])]
    return found


def _host_port(value: str) -> tuple[str, int] | None:
    value = value.strip()
    if "://" in value:
        parts = urlsplit(value)
        try:
            port = parts.port
        except ValueError:
            return None
        default = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379,
                   "postgres": 5432, "postgresql": 5432}.get(parts.scheme.lower())
        port = port or default
        return (parts.hostname or "", port) if parts.hostname and port else None
    match = re.match(r"^\[?([^\]]+?)\]?:(\d{1,5})$", value)
    return (match.group(1), int(match.group(2))) if match else None


def own_services(purpose: str) -> dict[tuple[str, int], str]:
    """same_server_key -> what it is, for every own service `purpose` may not reach. A
    service whose name does not resolve is left out (nothing can reach it by name)."""
    sources = list(_settings_services())
    with _providers_lock:
        providers = list(_providers)
    for label, provider in providers:
        if label in _EXEMPT.get(purpose, set()):
            continue
        sources += [(label, item) for item in provider()]
    found: dict[tuple[str, int], str] = {}
    for label, value in sources:
        host_port = _host_port(value)
        if host_port is None:
            continue
        try:
            addresses = resolve(host_port[0].lower(), host_port[1])
        except DestinationRefused:
            continue
        for address in addresses:
            found.setdefault(same_server_key(address, host_port[1]), label)
    return found


def allowed_networks(purpose: str) -> list[Network]:
    from django.conf import settings

    return list(getattr(settings, "OUTBOUND_ALLOWED_NETWORKS", {}).get(purpose, []))


def address_refusal(address: IPAddress, *, purpose: str) -> str | None:
    """Why `purpose` may not connect to `address` (not counting own services), as a phrase
    ("is loopback (this host)", "carries 127.0.0.1, which is ..."), or None."""
    address = _plain(address)
    allowed = allowed_networks(purpose)
    if any(address in network for network in allowed if network.version == address.version):
        return None
    for candidate in (address, *_embedded_ipv4(address)):
        inside = "is " if candidate == address else f"carries {candidate}, which is "
        for network, why in _REFUSED:
            if candidate.version == network.version and candidate in network:
                return inside + why
        if is_this_host(candidate):
            return inside + "an address of this host"
    return None


def destination_check(url: str, *, purpose: str) -> Destination:
    """The checked destination of `url` for `purpose` (one of PURPOSES), or
    DestinationRefused saying why (DestinationUnresolved when the name does not resolve)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}")
    scheme, host, port = _url_parts(url)
    addresses = resolve(host, port)
    own = own_services(purpose)
    shown = f"[{host}]" if ":" in host else host
    for address in addresses:
        name = own.get(same_server_key(address, port))
        if name:
            raise DestinationRefused(
                f"{shown}:{port} is {name}, one of fleetctl's own services: it is never "
                f"reached through a {purpose[:-1]} address")
        why = address_refusal(address, purpose=purpose)
        if why:
            via = "" if address == _literal(host) else f" resolves to {address}, which"
            raise DestinationRefused(
                f"{shown}{via} {why}: {purpose} may not reach it unless an administrator "
                f"allow-lists it (setting OUTBOUND_ALLOW_{purpose.upper()})")
    return Destination(url=url, scheme=scheme, host=host, port=port, addresses=addresses)


def destination_request(method: str, url: str, *, purpose: str, content: bytes | None = None,
                        headers: dict[str, str] | None = None, timeout_s: float,
                        max_body: int | None = None) -> OutboundResponse:
    """Check `url` for `purpose`, then send the request to the addresses that were checked,
    in the resolver's order until one answers: the URL's host goes in the Host header and,
    for https, in TLS (SNI and certificate check), but the name is not looked up again.
    Raises DestinationRefused, or OutboundError as the shared client does."""
    destination = destination_check(url, purpose=purpose)
    parts = urlsplit(url.strip())
    default_port = 443 if destination.scheme == "https" else 80
    shown_host = f"[{destination.host}]" if ":" in destination.host else destination.host
    host_header = shown_host if destination.port == default_port else \
        f"{shown_host}:{destination.port}"
    sent = {**(headers or {}), "Host": host_header}
    is_name = destination.addresses[0] != _literal(destination.host)
    extensions = {"sni_hostname": destination.host} if (
        destination.scheme == "https" and is_name) else None
    last: OutboundError | None = None
    for address in destination.addresses:
        netloc = f"[{address}]" if address.version == 6 else str(address)
        pinned = parts._replace(scheme=destination.scheme,
                                netloc=f"{netloc}:{destination.port}").geturl()
        try:
            return shared_client().request(method, pinned, content=content, headers=sent,
                                           timeout_s=timeout_s, max_body=max_body,
                                           extensions=extensions)
        except OutboundUnreachable as exc:
            last = exc
    assert last is not None
    raise last


def _literal(host: str) -> IPAddress | None:
    try:
        return _plain(ipaddress.ip_address(host))
    except ValueError:
        return None


def url_problem(url: str, *, purpose: str, unresolved_ok: bool = True) -> str | None:
    """destination_check as a sentence for a form or serializer, or None when allowed. A
    name that does not resolve now passes when `unresolved_ok` (it is checked again before
    each connection)."""
    try:
        destination_check(url, purpose=purpose)
    except DestinationUnresolved as exc:
        return None if unresolved_ok else str(exc)
    except DestinationRefused as exc:
        return str(exc)
    return None
