"""A guard against request forgery for requests to URLs someone else chose: the renders a provider names
(media) and the webhook endpoints an account names (gateway).

A render URL comes from a provider's answer, so it is treated as hostile, and so is an endpoint URL: it could
name our own network (a database, the cloud metadata service at 169.254.169.254, a sidecar on loopback) and
have us fetch it. A session from `guarded_session` talks only to public addresses:

- every request is screened before anything is sent: https only (plain http only for an allowed host), no
  credentials in the URL, and a host written as an IP address, in any spelling getaddrinfo accepts, must be a
  public address;
- a name is resolved once, by the session's own resolver, and refused if any address it resolves to is not
  public; the connector then connects to exactly the addresses that were checked, with no DNS cache and no
  second lookup, so an answer that changes between the check and the connect (DNS rebinding) gains nothing;
- no proxy from the environment applies, so no third party decides where the request goes.

Hosts listed in VIDJOBS_DOWNLOAD_ALLOW_HOSTS (`host` or `host:port`) skip the address checks and may use http:
the fake provider, or a provider on our own network. Everything else is refused with a final
MediaError(DOWNLOAD_FAILED): asking again would be refused again. The session never follows redirects itself;
download.py follows them hop by hop, so each hop passes through this guard again. A guard for another purpose
names it, its own allow setting and its own error (`Purpose`).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from vidjobs.common import tracing
from vidjobs.common.dns import BoundedResolver
from vidjobs.common.errors import ErrorCode, MediaError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
log = logging.getLogger("vidjobs.netguard")

ALLOW_SETTING = "VIDJOBS_DOWNLOAD_ALLOW_HOSTS"
SCHEMES = frozenset({"http", "https"})
DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)

_V4, _V6 = ipaddress.IPv4Network, ipaddress.IPv6Network

# The first range an address falls in names why it is refused. `is_global` alone is not enough: Python 3.11
# calls multicast, site-local and NAT64 addresses global, and says nothing of what an IPv6 address embeds.
_REFUSED_V4 = (
    (_V4("0.0.0.0/8"), "an address of 0.0.0.0/8, which reaches this machine"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("169.254.0.0/16"), "a link-local address (cloud metadata services answer at 169.254.169.254)"),
    (_V4("10.0.0.0/8"), "a private address"),
    (_V4("172.16.0.0/12"), "a private address"),
    (_V4("192.168.0.0/16"), "a private address"),
    (_V4("100.64.0.0/10"), "a carrier-grade NAT address (100.64.0.0/10)"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("240.0.0.0/4"), "a reserved address"),
)
_REFUSED_V6 = (
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "the loopback address"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a site-local address"),
    (_V6("fc00::/7"), "a unique-local (private) address"),
    (_V6("ff00::/8"), "a multicast address"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address"),
)
_SPECIAL = "a special-purpose address (documentation, benchmarking, protocol use)"
_NAT64 = _V6("64:ff9b::/96")
_V4_COMPATIBLE = _V6("::/96")
# The legacy IPv4 spellings inet_aton (and so getaddrinfo) accepts: 2852039166, 0xA9FEA9FE, 0251.0376.0251.0376,
# 169.254.43518. Matched in full, because glibc's inet_aton ignores anything after a space.
_LEGACY_V4 = re.compile(r"[0-9a-fx.]+")


def refused(message: str) -> MediaError:
    """A refusal is final: the same URL would be refused on every retry."""
    return MediaError(ErrorCode.DOWNLOAD_FAILED, message, final=True)


@dataclass(frozen=True)
class Purpose:
    """What the guarded requests are for, as refusals say it, where to allow a host, and the error raised."""

    doing: str = "fetch the finished render"
    setting: str = ALLOW_SETTING
    error: Callable[[str], Exception] = refused
    # Whether a refusal may name the address a host resolved to. Not when the URL's author reads the refusal
    # (an account's webhook endpoint): it would map our internal DNS for them. The log keeps the detail.
    names_resolved: bool = True


DOWNLOADS = Purpose()


class UnsafeDestination(ValueError):
    """An export's destination the guard refuses; its message says why and what to do."""


# A copy of a stored clip to a URL its owner names (a presigned PUT of their bucket). Its author reads the
# refusals, so they never name the addresses a host resolved to.
EXPORTS = Purpose(doing="export the clip", setting="VIDJOBS_EXPORT_ALLOW_HOSTS", error=UnsafeDestination,
                  names_resolved=False)


# --- addresses ------------------------------------------------------------------------------------------


def why_not_public(addr: IPAddress) -> str | None:
    """Why a connection to `addr` could reach something that is not the public internet; None if it cannot."""
    if isinstance(addr, ipaddress.IPv6Address):
        return _why_not_public_v6(ipaddress.IPv6Address(int(addr)))  # the zone (%eth0) changes nothing here
    for network, why in _REFUSED_V4:
        if addr in network:
            return why
    return None if addr.is_global and not addr.is_reserved else _SPECIAL


def _why_not_public_v6(addr: ipaddress.IPv6Address) -> str | None:
    for network, why in _REFUSED_V6[:2]:  # :: and ::1 lie inside the IPv4-compatible range below
        if addr in network:
            return why
    kind, embedded, decides = _embedded_ipv4(addr)
    for v4 in embedded:
        if refused := why_not_public(v4):
            return f"the {kind} form of {v4}, which is {refused}"
    if decides:
        return None  # the connection reaches the embedded IPv4 address, which is public
    for network, why in _REFUSED_V6[2:]:
        if addr in network:
            return why
    return None if addr.is_global and not addr.is_reserved else _SPECIAL


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> tuple[str, tuple[ipaddress.IPv4Address, ...], bool]:
    """The IPv4 addresses an IPv6 address carries, and whether they alone decide where it leads."""
    low32 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.ipv4_mapped is not None:
        return "IPv4-mapped", (addr.ipv4_mapped,), True
    if addr in _NAT64:
        return "NAT64", (low32,), True
    if addr in _V4_COMPATIBLE:
        return "IPv4-compatible", (low32,), True
    if addr.sixtofour is not None:
        return "6to4", (addr.sixtofour,), False
    if addr.teredo is not None:
        return "Teredo", addr.teredo, False
    return "", (), False


def literal_address(host: str) -> tuple[IPAddress, bool] | None:
    """The address a URL host spells out, and whether it is spelt the ordinary way; None for a name."""
    bare = host.lower().removeprefix("[").removesuffix("]")
    plain = bare.rstrip(".")
    try:
        addr = ipaddress.ip_address(plain.replace("%25", "%"))
    except ValueError:
        pass
    else:
        return addr, plain == bare
    if _LEGACY_V4.fullmatch(plain):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(plain)), False
        except OSError:
            return None
    return None


# --- the policy -----------------------------------------------------------------------------------------


def screen_url(raw: str | URL, purpose: Purpose = DOWNLOADS) -> URL:
    """What every hop must be before any policy applies: an http(s) URL with a host and no credentials."""
    refuse, doing = purpose.error, purpose.doing
    try:
        url = raw if isinstance(raw, URL) else URL(raw)
    except (TypeError, ValueError) as exc:
        raise refuse(f"We refused to {doing}: its address is not a valid URL.") from exc
    if url.scheme not in SCHEMES:
        raise refuse(f"We refused to {doing}: its address uses the {url.scheme or 'empty'}: scheme, and only https "
                     f"(or http to a host listed in {purpose.setting}) is used.")
    if url.user is not None or url.password is not None:
        raise refuse(f"We refused to {doing}: its address carries a user name or password, which we never send.")
    if not url.raw_host:
        raise refuse(f"We refused to {doing}: its address names no host.")
    return url


def _bare_host(host: str) -> str:
    return host.lower().removeprefix("[").removesuffix("]").rstrip(".")


def _host_port(host: str, port: int | None) -> str:
    bare = _bare_host(host)
    shown = f"[{bare}]" if ":" in bare else bare
    return f"{shown}:{port}" if port else shown


@dataclass(frozen=True)
class DownloadGuard:
    """Which hosts may be reached although they are not public (or use plain http), for one purpose."""

    allowed: frozenset[str] = frozenset()
    purpose: Purpose = DOWNLOADS

    def allows(self, host: str, port: int | None) -> bool:
        keys = {_bare_host(host), _host_port(host, None), _host_port(host, port)}  # IPv6 with or without brackets
        return not self.allowed.isdisjoint(keys)

    def check_request(self, url: URL) -> None:
        """Scheme and literal address of one request; a name's addresses are checked when it is resolved."""
        screen_url(url, self.purpose)
        host, port = url.raw_host or "", url.port
        literal = literal_address(host)
        refuse = self.purpose.error
        if literal is not None and not literal[1]:
            raise refuse(_spelling_refusal(host, literal[0], self.purpose))
        if self.allows(host, port):
            return
        if literal is not None and (why := why_not_public(literal[0])):
            raise refuse(_address_refusal(host, port, literal[0], why, self.purpose))
        if url.scheme != "https":
            raise refuse(f"We refused to {self.purpose.doing} at {host} over plain http: only https is used for "
                         f"hosts not listed in {self.purpose.setting} (add '{_host_port(host, port)}' there if "
                         f"it really only speaks http).")

    def check_resolved(self, host: str, port: int, results: Sequence[ResolveResult]) -> None:
        """Every address a name resolved to must be public, or one of them could be the one connected to."""
        if self.allows(host, port):
            return
        for result in results:
            addr = ipaddress.ip_address(result["host"])
            if why := why_not_public(addr):
                raise self.purpose.error(_address_refusal(host, port, addr, why, self.purpose))

    async def middleware(self, req: aiohttp.ClientRequest,
                         handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        """Runs before every request the session sends, whoever sends it."""
        self.check_request(req.url)
        return await handler(req)


def _address_refusal(host: str, port: int | None, addr: IPAddress, why: str, purpose: Purpose) -> str:
    if _bare_host(host) == str(addr):
        what = f"it is {why}, not"
    elif purpose.names_resolved:
        what = f"it resolves to {addr}, {why}, not"
    else:
        log.info("refused a name resolving to an address that is not public",
                 extra={"host": host, "address": str(addr), "why": why, "doing": purpose.doing})
        what = "its name resolves to an address that is not"
    return (f"We refused to {purpose.doing} at {_host_port(host, None)}: {what} an address on the public "
            f"internet. If it really is to be reached there, add '{_host_port(host, port)}' to {purpose.setting}.")


def _spelling_refusal(host: str, addr: IPAddress, purpose: Purpose) -> str:
    why = why_not_public(addr)
    return (f"We refused to {purpose.doing} at {host}: it spells the address {addr}"
            f"{f' ({why})' if why else ''} in a legacy numeric form that no real service uses, and that no "
            f"setting allows.")


# --- the session ----------------------------------------------------------------------------------------


class GuardedResolver(AbstractResolver):
    """Looks a name up once through `lookup` and hands the connector only addresses that passed the guard.

    `lookup` defaults to the process's BoundedResolver (getaddrinfo on threads of its own, with a time
    limit); tests stand in their own DNS answers for made-up names. The lookup belongs to the caller, who
    closes it if it needs closing.
    """

    def __init__(self, guard: DownloadGuard, lookup: AbstractResolver | None = None):
        self._guard = guard
        self._lookup = lookup or BoundedResolver.shared()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._lookup.resolve(host, port, family)
        self._guard.check_resolved(host, port, results)
        return results

    async def close(self) -> None:
        """Nothing of our own to release."""


def guarded_session(allowed_hosts: Iterable[str], *, lookup: AbstractResolver | None = None,
                    timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT,
                    purpose: Purpose = DOWNLOADS) -> aiohttp.ClientSession:
    """A session for requests to untrusted URLs; call it inside the event loop that will use it."""
    guard = DownloadGuard(frozenset(h.strip().lower() for h in allowed_hosts if h.strip()), purpose)
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(guard, lookup), use_dns_cache=False)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                 middlewares=(guard.middleware,), trace_configs=tracing.client_trace_configs())


# --- a destination checked when it is named --------------------------------------------------------------


async def check_destination(url: str, guard: DownloadGuard, lookup: AbstractResolver | None = None) -> URL:
    """Raises the guard's purpose's error unless `url` may be sent to now: its form, its literal address, and
    every address its name resolves to at this moment. For a URL an account names (a webhook endpoint, an
    export's destination), so a refusal is told when it is named; the guarded session checks it again when
    it connects, since a name may resolve elsewhere by then."""
    purpose = guard.purpose
    parsed = screen_url(url, purpose)
    guard.check_request(parsed)
    host, port = parsed.raw_host or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    if literal_address(host) is not None or guard.allows(host, port):
        return parsed
    try:
        found = await (lookup or BoundedResolver.shared()).resolve(host, port)
    except OSError as exc:
        raise purpose.error(f"We refused to {purpose.doing} at {host}: the name does not resolve ({exc}).") from exc
    guard.check_resolved(host, port, found)
    return parsed
