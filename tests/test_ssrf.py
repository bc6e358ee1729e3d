"""Render URLs are hostile: a corpus of request-forgery attempts, each through the real `fetch_to_file` and the
media worker's guarded session, and one through the whole stack.

Nothing here sends a packet beyond loopback: every address outside it is refused before a connection is made,
which is what the tests prove. Servers on loopback that must never be reached (the tripwire) count their
connections; the allowed test server (the origin) counts its requests. Run with -s for the table of outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from tests.stack import running_stack, stack_settings
from vidjobs.common.errors import ErrorCode, MediaError
from vidjobs.common.netguard import DownloadGuard, GuardedResolver, guarded_session, why_not_public
from vidjobs.fakeprovider.clips import ClipSpec, render_mp4
from vidjobs.media.download import CHUNK_BYTES, MAX_REDIRECTS, fetch_to_file
from vidjobs.media.worker import may_retry

CAP_BYTES = 4 << 20  # the byte cap of the endless-body case
TIME_CAP_S = 1.0  # the time cap of the slow-drip case
# Made-up names and the addresses the stand-in DNS gives them.
DNS_ANSWERS = {
    "renders.internal.test": ["10.20.30.40"],
    "rebind.test": ["127.0.0.1"],  # loopback, where the tripwire would count a connection
}


# --- servers on loopback ---------------------------------------------------------------------------------


class Tripwire:
    """Listens on loopback where no request may ever arrive, and counts the connections that do."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0
        self.servers: list[asyncio.Server] = []

    async def start(self) -> None:
        self.servers.append(await asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self.servers[0].sockets[0].getsockname()[1]
        with contextlib.suppress(OSError):  # a machine without IPv6 loopback still runs every other case
            self.servers.append(await asyncio.start_server(self._accept, "::1", self.port))

    async def _accept(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.close()

    async def close(self) -> None:
        for server in self.servers:
            server.close()
            await server.wait_closed()


class Origin:
    """The allowed provider host: serves a real clip, redirects, an endless body and a slow drip, each bounded so
    the server can always shut down."""

    def __init__(self, clip: bytes, tripwire: Tripwire):
        self.clip = clip
        self.tripwire = tripwire
        self.hits: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()  # body bytes written, by path
        self.base = ""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._count])
        app.router.add_get("/clip.mp4", self._clip)
        app.router.add_get("/hop", self._redirect(lambda: "/clip.mp4"))
        app.router.add_get("/loop", self._redirect(lambda: "/loop"))
        app.router.add_get("/to-loopback", self._redirect(lambda: f"http://127.0.0.1:{self.tripwire.port}/x.mp4"))
        app.router.add_get("/to-localhost", self._redirect(lambda: f"https://localhost:{self.tripwire.port}/x.mp4"))
        app.router.add_get("/to-metadata", self._redirect(lambda: "http://169.254.169.254/latest/meta-data/"))
        app.router.add_get("/to-file", self._redirect(lambda: "file:///etc/passwd"))
        app.router.add_get("/endless.mp4", self._endless)
        app.router.add_get("/drip.mp4", self._drip)
        return app

    @web.middleware
    async def _count(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        self.hits[request.path] += 1
        return await handler(request)

    async def _clip(self, _: web.Request) -> web.Response:
        return web.Response(body=self.clip, content_type="video/mp4")

    @staticmethod
    def _redirect(target: Callable[[], str]) -> Callable:
        async def handler(_: web.Request) -> web.Response:
            raise web.HTTPFound(target())

        return handler

    async def _endless(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "video/mp4"})  # no length: only the reader can stop it
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(4096):  # at most 256 MiB
                await resp.write(bytes(64 << 10))
                self.sent[request.path] += 64 << 10
        return resp

    async def _drip(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "video/mp4"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(200):  # at most 10 s
                await resp.write(b"\0")
                self.sent[request.path] += 1
                await asyncio.sleep(0.05)
        return resp


class StandInDNS(AbstractResolver):
    """DNS answers for made-up names; any other name goes to getaddrinfo. Records every name asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self._real = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        if host not in DNS_ANSWERS:
            return await self._real.resolve(host, port, family)
        return [ResolveResult(hostname=host, host=a, port=port, family=socket.AF_INET, proto=socket.IPPROTO_TCP,
                              flags=socket.AI_NUMERICHOST) for a in DNS_ANSWERS[host]]

    async def close(self) -> None:
        """Nothing to release."""


@dataclass
class Env:
    origin: Origin
    tripwire: Tripwire
    dns: StandInDNS
    session: aiohttp.ClientSession


@dataclass
class Outcome:
    case: str
    outcome: str
    bytes_read: int
    ms: float


RESULTS: list[Outcome] = []


@pytest.fixture(scope="module", autouse=True)
def table() -> Iterator[None]:
    """Prints every case's outcome once the module has run (visible with -s)."""
    yield
    if RESULTS:
        width = max(len(r.case) for r in RESULTS)
        print(f"\n{'case':<{width}}  {'bytes read':>10}  {'ms':>8}  outcome")
        for r in RESULTS:
            print(f"{r.case:<{width}}  {r.bytes_read:>10}  {r.ms:>8.1f}  {r.outcome}")


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[Env]:
    tripwire = Tripwire()
    await tripwire.start()
    origin = Origin(await render_mp4(ClipSpec(width=160, height=90, duration_s=1.0, seed=7)), tripwire)
    runner = web.AppRunner(origin.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    origin.base = f"http://127.0.0.1:{port}"
    dns = StandInDNS()
    session = guarded_session([f"127.0.0.1:{port}"], lookup=dns)
    try:
        yield Env(origin, tripwire, dns, session)
    finally:
        await session.close()
        await runner.cleanup()
        await tripwire.close()


async def attempt(env: Env, case: str, url: str, dest: Path, *, max_bytes: int = 1 << 20,
                  timeout_s: float = 10.0) -> tuple[MediaError | None, int, float]:
    """One download; returns the error (if any), the bytes that reached the file and the time taken."""
    started = time.perf_counter()
    error = None
    try:
        await fetch_to_file(env.session, url, dest, headers={}, max_bytes=max_bytes, timeout_s=timeout_s)
    except MediaError as err:
        error = err
    ms = (time.perf_counter() - started) * 1000
    read = dest.stat().st_size if dest.exists() else 0
    outcome = "downloaded" if error is None else ("refused (final)" if error.final else "failed (retryable)")
    RESULTS.append(Outcome(case, f"{outcome}: {error.message[:100] if error else ''}", read, ms))
    return error, read, ms


# --- the corpus: refused before any connection -----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    url: str  # {trip} is the tripwire's port
    says: str  # a part of the refusal's message
    never_looked_up: tuple[str, ...] = field(default=())


REFUSED_BEFORE_CONNECTING: dict[str, Case] = {
    "private 10.x": Case("https://10.0.0.1/render.mp4", "10.0.0.1: it is a private address"),
    "private 172.16.x": Case("https://172.16.5.4/render.mp4", "172.16.5.4: it is a private address"),
    "private 192.168.x": Case("https://192.168.1.10/render.mp4", "192.168.1.10: it is a private address"),
    "loopback 127.0.0.1": Case("https://127.0.0.1:{trip}/render.mp4", "127.0.0.1: it is a loopback address"),
    "loopback [::1]": Case("https://[::1]:{trip}/render.mp4", "[::1]: it is the loopback address"),
    "unspecified 0.0.0.0": Case("https://0.0.0.0:{trip}/render.mp4", "0.0.0.0: it is an address of 0.0.0.0/8"),
    "CGNAT 100.64.1.1": Case("https://100.64.1.1/render.mp4", "carrier-grade NAT"),
    "metadata dotted": Case("http://169.254.169.254/latest/meta-data/", "169.254.169.254: it is a link-local"),
    "metadata decimal": Case("http://2852039166/latest/meta-data/", "spells the address 169.254.169.254"),
    "metadata hex": Case("http://0xA9FEA9FE/latest/meta-data/", "spells the address 169.254.169.254"),
    "metadata octal": Case("http://0251.0376.0251.0376/latest/meta-data/", "spells the address 169.254.169.254"),
    "metadata short": Case("http://169.254.43518/latest/meta-data/", "spells the address 169.254.169.254"),
    "metadata IPv6-mapped dotted": Case("http://[::ffff:169.254.169.254]/latest/", "IPv4-mapped form of 169.254."),
    "metadata IPv6-mapped hex": Case("http://[::ffff:a9fe:a9fe]/latest/", "IPv4-mapped form of 169.254.169.254"),
    "metadata NAT64": Case("http://[64:ff9b::a9fe:a9fe]/latest/", "NAT64 form of 169.254.169.254"),
    "unique-local fd00::1": Case("https://[fd00::1]/render.mp4", "unique-local"),
    "link-local fe80::1": Case("https://[fe80::1]/render.mp4", "[fe80::1]: it is a link-local address"),
    "name -> loopback (localhost)": Case("https://localhost:{trip}/render.mp4", "localhost: it resolves to"),
    "made-up name -> 10.x": Case("https://renders.internal.test/render.mp4", "it resolves to 10.20.30.40"),
    "made-up name -> 127.0.0.1": Case("https://rebind.test:{trip}/render.mp4", "it resolves to 127.0.0.1"),
    "file:": Case("file:///etc/passwd", "the file: scheme"),
    "gopher:": Case("gopher://127.0.0.1:{trip}/_GET%20/", "the gopher: scheme"),
    "ftp:": Case("ftp://ftp.renders.test/render.mp4", "the ftp: scheme", never_looked_up=("ftp.renders.test",)),
    "data:": Case("data:video/mp4;base64,AAAA", "the data: scheme"),
    "plain http to a public-looking host": Case("http://cdn.renders.test/render.mp4", "over plain http",
                                                never_looked_up=("cdn.renders.test",)),
    "credentials in the URL": Case("https://user:hunter2@cdn.renders.test/render.mp4", "user name or password",
                                   never_looked_up=("cdn.renders.test",)),
}


@pytest.mark.parametrize("name", REFUSED_BEFORE_CONNECTING)
async def test_a_hostile_url_is_refused_before_any_connection(env: Env, tmp_path: Path, name: str):
    case = REFUSED_BEFORE_CONNECTING[name]
    url = case.url.format(trip=env.tripwire.port)
    error, read, _ = await attempt(env, name, url, tmp_path / "v.mp4")

    assert error is not None and error.code is ErrorCode.DOWNLOAD_FAILED
    assert case.says in error.message, error.message
    assert error.final, "retrying a refused address cannot help"
    assert read == 0
    assert env.tripwire.connections == 0
    assert not set(case.never_looked_up) & set(env.dns.asked)
    assert "hunter2" not in error.message


# --- the corpus: redirects, and what an allowed host may still do wrong ----------------------------------


@pytest.mark.parametrize(("path", "says"), [
    ("/to-loopback", "127.0.0.1: it is a loopback address"),
    ("/to-localhost", "localhost: it resolves to"),
    ("/to-metadata", "169.254.169.254: it is a link-local address"),
    ("/to-file", "the file: scheme"),
])
async def test_a_redirect_from_an_allowed_host_is_checked_again(env: Env, tmp_path: Path, path: str, says: str):
    error, read, _ = await attempt(env, f"redirect {path}", env.origin.base + path, tmp_path / "v.mp4")

    assert error is not None and error.final and says in error.message, error
    assert read == 0
    assert env.origin.hits[path] == 1
    assert env.tripwire.connections == 0


async def test_a_redirect_loop_stops_at_the_hop_limit(env: Env, tmp_path: Path):
    error, read, _ = await attempt(env, "redirect loop", env.origin.base + "/loop", tmp_path / "v.mp4")

    assert error is not None and error.final
    assert f"more than {MAX_REDIRECTS} times" in error.message
    assert read == 0 and env.origin.hits["/loop"] == MAX_REDIRECTS + 1


async def test_an_endless_body_stops_at_the_byte_cap(env: Env, tmp_path: Path):
    error, read, _ = await attempt(env, "endless body (byte cap)", env.origin.base + "/endless.mp4",
                                   tmp_path / "v.mp4", max_bytes=CAP_BYTES)

    assert error is not None and "larger than" in error.message
    assert not error.final  # the existing retry policy decides about oversized renders
    assert CAP_BYTES - CHUNK_BYTES <= read <= CAP_BYTES


async def test_a_slow_endless_drip_stops_at_the_time_cap(env: Env, tmp_path: Path):
    error, read, ms = await attempt(env, "slow drip (time cap)", env.origin.base + "/drip.mp4", tmp_path / "v.mp4",
                                    timeout_s=TIME_CAP_S)

    assert error is not None and "took longer" in error.message
    assert read < 200  # far from the whole drip: it was cut off
    assert ms >= TIME_CAP_S * 1000 * 0.9


@pytest.mark.parametrize("path", ["/clip.mp4", "/hop"])
async def test_an_allowed_host_still_serves_a_normal_video(env: Env, tmp_path: Path, path: str):
    error, read, _ = await attempt(env, f"allowed host {path}", env.origin.base + path, tmp_path / "v.mp4")

    assert error is None
    assert read == len(env.origin.clip)
    assert hashlib.sha256((tmp_path / "v.mp4").read_bytes()).hexdigest() == hashlib.sha256(env.origin.clip).hexdigest()


# --- the policy's parts, without any network ---------------------------------------------------------------


@pytest.mark.parametrize(("address", "public"), [
    ("8.8.8.8", True), ("2606:4700::1111", True), ("::ffff:8.8.8.8", True), ("64:ff9b::808:808", True),
    ("2002:808:808::1", True),
    ("224.0.0.1", False), ("255.255.255.255", False), ("192.0.2.1", False), ("198.18.0.1", False),
    ("fec0::1", False), ("ff02::1", False), ("2001:db8::1", False), ("64:ff9b:1::808:808", False),
    ("2002:a9fe:a9fe::1", False), ("::a9fe:a9fe", False), ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),
    ("fe80::1%eth0", False), ("::", False),
])
def test_addresses_that_python_calls_global_are_still_judged_by_what_they_reach(address: str, public: bool):
    assert (why_not_public(ipaddress.ip_address(address)) is None) is public


async def test_one_private_address_among_public_ones_is_enough_to_refuse():
    class Mixed(StandInDNS):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            return [ResolveResult(hostname=host, host=a, port=port, family=socket.AF_INET, proto=6, flags=0)
                    for a in ("8.8.8.8", "192.168.0.7")]

    resolver = GuardedResolver(DownloadGuard(), Mixed())
    with pytest.raises(MediaError) as caught:
        await resolver.resolve("cdn.renders.test", 443)
    assert caught.value.final and "it resolves to 192.168.0.7" in caught.value.message
    allowed = GuardedResolver(DownloadGuard(frozenset({"cdn.renders.test:443"})), Mixed())
    assert len(await allowed.resolve("cdn.renders.test", 443)) == 2


def test_a_final_download_failure_is_not_retried():
    now = datetime.now(UTC)
    later = now + timedelta(minutes=5)
    assert may_retry(MediaError(ErrorCode.DOWNLOAD_FAILED, "HTTP 503"), 1, 4, later, now)
    assert not may_retry(MediaError(ErrorCode.DOWNLOAD_FAILED, "refused", final=True), 1, 4, later, now)


# --- through the whole stack -----------------------------------------------------------------------------


async def test_a_job_whose_render_url_is_unsafe_fails_without_retrying(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, retry_base_s=0.2, retry_cap_s=1)
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "unsafe_output", "render_s": 0.1})
        done = await stack.wait_terminal(job["id"], within=60)
        trail = await stack.trail(job["id"])
        copies = await _media_copies(stack)

    assert done["status"] == "failed" and done["error"]["code"] == "download_failed"
    assert "169.254.169.254" in done["error"]["message"]
    assert "VIDJOBS_DOWNLOAD_ALLOW_HOSTS" in done["error"]["message"]
    assert done["error"]["retryable"] is False  # the provider would name the same address again
    moves = [(m["from"], m["to"]) for m in trail]
    assert moves[-1] == ("downloading", "failed") and moves.count(("downloading", "failed")) == 1
    assert copies == {("failed", "download_failed"): 1.0}  # one attempt, no retry


async def _media_copies(stack) -> dict[tuple[str, str], float]:
    """The media worker's copy outcomes, from its own /metrics."""
    pid = stack.supervisor.pid("media")
    ports = [c.laddr.port for c in psutil.Process(pid).net_connections() if c.status == "LISTEN"]
    assert len(ports) == 1, ports
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{ports[0]}/metrics") as resp:
        text = await resp.text()
    copies = {}
    for line in text.splitlines():
        if line.startswith("vidjobs_media_copies_total{"):
            labels, value = line.removeprefix("vidjobs_media_copies_total{").split("} ")
            parsed = dict(part.split("=") for part in labels.split(","))
            copies[(parsed["outcome"].strip('"'), parsed["code"].strip('"'))] = float(value)
    return copies
