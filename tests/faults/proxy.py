"""Network faults without root: a TCP proxy put between a client and one server, switched at any moment into
latency, a bandwidth limit, resets, a black hole or refused connects, and back to clean piping.

Each accepted connection gets a connection of its own to the target, and bytes are piped both ways. Each way of
each connection is a reader and a writer joined by a queue of at most QUEUE_CHUNKS chunks of at most CHUNK
bytes: the reader waits for room before reading more, so a throttled or latent way holds a bounded number of
bytes and the sender meets TCP's own backpressure, as it would on a slow link.

A fault switched on acts on live connections and new ones alike. The data faults replace one another
(`black_hole`, `reset`, and clean piping); `latency` and `bandwidth` shape what clean piping delivers; `refuse`
only closes the listening socket, so it overlaps any of them (`reset` then `refuse` is a server that died).
`heal` ends them all.

    async with FaultProxy("127.0.0.1", pg_port) as proxy:
        url = proxy.url_for("postgresql://postgres@127.0.0.1:5432/db")
        proxy.black_hole()
        ...
        proxy.heal()
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from vidjobs.cli.embedded import free_port

CHUNK = 64 * 1024
QUEUE_CHUNKS = 8  # per way of a connection: at most 512 KiB waiting out latency or the throttle
MAX_HELD = (QUEUE_CHUNKS + 2) * CHUNK  # a way's queue, and a chunk in its reader's hand and its writer's
SLICES_PER_S = 20  # a throttled chunk is written in slices of a twentieth of a second's worth, at least 512 bytes

Way = Literal["up", "down"]  # up: client to target; down: target to client
T = TypeVar("T")


class Mode(enum.Enum):
    PIPE = "pipe"
    BLACK_HOLE = "black_hole"
    RESET = "reset"


@dataclasses.dataclass
class Counters:
    """Bytes are counted per way: received from the sender, delivered to the receiver, dropped in a black hole.
    What is received and neither delivered nor dropped is held by the proxy (`held`)."""

    accepted: int = 0
    reset: int = 0  # connections closed with RST by `reset`, live or new (each counted once)
    received_up: int = 0
    received_down: int = 0
    bytes_up: int = 0  # delivered to the target
    bytes_down: int = 0  # delivered to the client
    dropped_up: int = 0
    dropped_down: int = 0

    def held(self, way: Way) -> int:
        if way == "up":
            return self.received_up - self.bytes_up - self.dropped_up
        return self.received_down - self.bytes_down - self.dropped_down


def proxied_url(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced, the rest (scheme, user, password, path, query) kept. One server
    only: a comma-separated NATS server list is the caller's to split."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}:{port}"))


def _hard_close(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER on with a zero timeout makes close() abort the connection."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclasses.dataclass
class _Chunk:
    data: bytes
    arrived: float
    jitter: float  # this chunk's share of the jitter, in [0, 1)


class FaultProxy:
    """A TCP proxy on `listen_host:listen_port` to `target_host:target_port`, on the running event loop.

    `listen_port=0` picks a free port below the kernel's ephemeral range, so that after `refuse` no outgoing
    connection can be handed it before `heal` listens on it again.

    Faults (each may be called at any moment, from the loop's thread; see ProxyThread for another thread):
    - `latency(s, jitter_s)`: every chunk, each way, is delivered `s` plus up to `jitter_s` after it was read,
      in order (jitter never reorders a stream).
    - `bandwidth(bytes_per_s)`: each way is throttled to that rate, shared by every connection.
    - `reset()`: every live connection is closed with RST on both sides, and new ones at once.
    - `black_hole()`: connections are accepted and read, and what they send is dropped both ways; nothing is
      answered and nothing is closed, as a partition looks to a client with an established connection. A
      connection accepted meanwhile is connected to the target only when the hole ends. A FIN is held, not
      dropped, and delivered when the hole ends (TCP would retransmit it).
    - `refuse()`: the listening socket is closed, so connects are refused; live connections carry on.
      (A target that cannot be reached is met the same way: each connection is reset once its own connect to
      the target fails.)
    - `heal()`: clean piping again, listening on the same port. Data black-holed before it is gone, never
      delivered late: a connection that lived through a hole carries on with a gap in its stream, which a
      client's protocol will usually take for a broken connection.
    """

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0, *,
                 listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.host = listen_host
        self.port = listen_port or free_port(listen_host)
        self.counters = Counters()
        self.mode = Mode.PIPE
        self.latency_s = 0.0
        self.jitter_s = 0.0
        self.rate: float | None = None
        self._next_free: dict[Way, float] = {"up": 0.0, "down": 0.0}
        self._changed = asyncio.Event()
        self._links: set[_Link] = set()
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._refuse_at: int | None = None  # refuse connects once this many were accepted in all

    # -- lifecycle

    async def start(self) -> FaultProxy:
        self._listen()
        return self

    async def stop(self) -> None:
        self._unlisten()
        links = list(self._links)
        for link in links:
            link.close()
        await asyncio.gather(*(link.done for link in links), return_exceptions=True)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def listening(self) -> bool:
        return self._listener is not None

    @property
    def live(self) -> int:
        return len(self._links)

    def url_for(self, url: str) -> str:
        """`url`, which names this proxy's target, pointed at the proxy instead."""
        parts = urlsplit(url)
        if parts.port != self.target[1]:
            raise ValueError(f"{url} does not name the proxy's target port {self.target[1]}")
        return proxied_url(url, self.host, self.port)

    # -- faults

    def latency(self, seconds: float, jitter_s: float = 0.0) -> None:
        self.latency_s, self.jitter_s = seconds, jitter_s
        self._tell()

    def bandwidth(self, bytes_per_s: float | None) -> None:
        """None lifts the limit."""
        self.rate = bytes_per_s
        self._next_free = {"up": 0.0, "down": 0.0}
        self._tell()

    def reset(self) -> None:
        self.mode = Mode.RESET
        for link in list(self._links):
            link.reset()
        self._tell()

    def black_hole(self) -> None:
        self.mode = Mode.BLACK_HOLE
        self._tell()

    def refuse(self) -> None:
        self._unlisten()

    def refuse_after(self, accepted: int) -> None:
        """Refuse connects once `accepted` connections were accepted in all, those before this call counted: a
        server that answered a first connection and went away before the next. Those accepted are piped on."""
        self._refuse_at = accepted
        if self.counters.accepted >= accepted:
            self.refuse()

    def heal(self) -> None:
        self._refuse_at = None
        self.mode = Mode.PIPE
        self.latency(0.0)
        self.bandwidth(None)
        if not self.listening:
            self._listen()
        for link in list(self._links):
            link.connect_upstream()  # those accepted during a black hole

    def _tell(self) -> None:
        """Wake every wait that depends on the faults, so a change acts on chunks already waiting."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- listening

    def _listen(self) -> None:
        """Bound and listening before this returns, so a connect made right after succeeds."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._listener = sock
        self._accepting = asyncio.get_running_loop().create_task(self._accept(sock))

    def _unlisten(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            self._accepting = None
        if self._listener is not None:
            # The cancelled accept leaves its reader registered until the loop runs it; a descriptor closed while
            # registered would be reused by the next socket and confuse the selector.
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()  # connects now meet RST: refused
            self._listener = None

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            self.counters.accepted += 1
            if self.mode is Mode.RESET:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
                self.counters.reset += 1
                continue
            try:
                reader, writer = await asyncio.open_connection(sock=conn, limit=CHUNK)
            except OSError:
                conn.close()  # gone before it was wrapped
                continue
            link = _Link(self, reader, writer)
            self._links.add(link)
            link.done.add_done_callback(functools.partial(self._forget, link))
            if self._refuse_at is not None and self.counters.accepted >= self._refuse_at:
                self._unlisten()  # cancels this very task, which ends here without waiting again
                return

    def _forget(self, link: _Link, _: object) -> None:
        self._links.discard(link)

    # -- what the pumps wait for

    async def wait_until(self, deadline: Callable[[], float]) -> None:
        """Until the monotonic time `deadline()` returns, asked again whenever a fault changes."""
        while (left := deadline() - time.monotonic()) > 0:
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await changed.wait()

    async def wait_for_condition(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def throttle(self, way: Way, size: int) -> None:
        """Wait out `size` bytes' time at the rate, after the bytes reserved before them on the same way."""
        if self.rate is None:
            return
        end = max(time.monotonic(), self._next_free[way]) + size / self.rate
        self._next_free[way] = end
        await self.wait_until(lambda: end if self.rate is not None else 0.0)

    def slice_size(self) -> int:
        return CHUNK if self.rate is None else max(512, int(self.rate / SLICES_PER_S))


class _Link:
    """One accepted connection and its connection to the target: four pumps, ended together."""

    def __init__(self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.proxy = proxy
        self.client = (reader, writer)
        loop = asyncio.get_running_loop()
        self.upstream: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = loop.create_future()
        self._connecting: asyncio.Task[None] | None = None
        self._task = loop.create_task(self._run())
        self.done: asyncio.Future[None] = self._task

    async def _run(self) -> None:
        up: asyncio.Queue[_Chunk | None] = asyncio.Queue(QUEUE_CHUNKS)
        down: asyncio.Queue[_Chunk | None] = asyncio.Queue(QUEUE_CHUNKS)
        try:
            async with asyncio.TaskGroup() as pumps:
                if self.proxy.mode is Mode.PIPE:
                    self.connect_upstream()
                pumps.create_task(self._read(self._client_reader, up, "up"))
                pumps.create_task(self._write(up, self._upstream_writer, "up"))
                pumps.create_task(self._read(self._upstream_reader, down, "down"))
                pumps.create_task(self._write(down, self._client_writer, "down"))
        except* (OSError, EOFError):
            pass  # one side hung up hard or could not be reached: the other is closed below
        finally:
            self._shut(hard=False)

    def connect_upstream(self) -> None:
        if self._connecting is None and not self._task.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            opened = await asyncio.open_connection(*self.proxy.target, limit=CHUNK)
        except OSError as e:
            _hard_close(self.client[1])  # as near as a proxy gets to the refused connect the client would meet
            if not self.upstream.done():
                self.upstream.set_exception(e)  # the pumps waiting on it end the link
            return
        if self.upstream.done():  # the link ended while connecting
            opened[1].close()
        else:
            self.upstream.set_result(opened)

    async def _client_reader(self) -> asyncio.StreamReader:
        return self.client[0]

    async def _client_writer(self) -> asyncio.StreamWriter:
        return self.client[1]

    async def _upstream_reader(self) -> asyncio.StreamReader:
        return (await asyncio.shield(self.upstream))[0]

    async def _upstream_writer(self) -> asyncio.StreamWriter:
        self.connect_upstream()
        return (await asyncio.shield(self.upstream))[1]

    async def _read(self, source: Callable[[], Awaitable[asyncio.StreamReader]],
                    queue: asyncio.Queue[_Chunk | None], way: Way) -> None:
        reader, counters = await source(), self.proxy.counters
        while data := await reader.read(CHUNK):
            _count(counters, f"received_{way}", len(data))
            if self.proxy.mode is Mode.BLACK_HOLE:
                _count(counters, f"dropped_{way}", len(data))
                continue
            await queue.put(_Chunk(data, time.monotonic(), random.random()))
        await queue.put(None)

    async def _write(self, queue: asyncio.Queue[_Chunk | None],
                     sink: Callable[[], Awaitable[asyncio.StreamWriter]], way: Way) -> None:
        proxy, last_due = self.proxy, 0.0
        while (chunk := await queue.get()) is not None:
            def due(chunk: _Chunk = chunk, after: float = last_due) -> float:
                return max(chunk.arrived + proxy.latency_s + chunk.jitter * proxy.jitter_s, after)
            await proxy.wait_until(due)
            last_due = due()
            data = memoryview(chunk.data)
            while data:
                size = proxy.slice_size()
                piece, data = data[:size], data[size:]
                await proxy.throttle(way, len(piece))
                if proxy.mode is Mode.BLACK_HOLE:  # switched on while the chunk waited: dropped with the rest
                    _count(proxy.counters, f"dropped_{way}", len(piece))
                    continue
                writer = await sink()
                writer.write(piece)
                await writer.drain()
                _count(proxy.counters, f"bytes_{way}", len(piece))
        await proxy.wait_for_condition(lambda: proxy.mode is not Mode.BLACK_HOLE)  # the FIN outlives the hole
        writer = await sink()
        if writer.can_write_eof():
            writer.write_eof()

    def reset(self) -> None:
        self.proxy.counters.reset += 1
        self._shut(hard=True)
        self._task.cancel()

    def close(self) -> None:
        self._shut(hard=False)
        self._task.cancel()

    def _shut(self, *, hard: bool) -> None:
        writers = [self.client[1]]
        if self.upstream.done() and not self.upstream.cancelled() and self.upstream.exception() is None:
            writers.append(self.upstream.result()[1])
        elif not self.upstream.done():
            self.upstream.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
        for writer in writers:
            if hard:
                _hard_close(writer)
            else:
                writer.close()


def _count(counters: Counters, name: str, size: int) -> None:
    setattr(counters, name, getattr(counters, name) + size)


class ProxyThread:
    """A FaultProxy on an event loop of its own thread, for a caller whose own loop blocks (synchronous code, or
    a harness waiting on subprocesses): the proxy keeps piping meanwhile.

        with ProxyThread("127.0.0.1", port) as proxied:
            proxied.call(FaultProxy.black_hole)
    """

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0):
        self._args = (target_host, target_port, listen_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self.proxy: FaultProxy | None = None

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        self.proxy = self._run(FaultProxy(*self._args).start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proxy is not None:
                self._run(self.proxy.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def _run(self, coroutine: Awaitable[T]) -> T:
        async def run() -> T:
            return await coroutine
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def call(self, fault: Callable[..., Any], *args: Any) -> Any:
        """`fault(proxy, *args)` on the proxy's loop (`FaultProxy.latency, 0.1`), returned once it has run."""
        done: Future[Any] = Future()

        def run() -> None:
            try:
                done.set_result(fault(self.proxy, *args))
            except BaseException as e:  # handed to the caller's thread
                done.set_exception(e)
        self._loop.call_soon_threadsafe(run)
        return done.result(timeout=30)

    @property
    def port(self) -> int:
        assert self.proxy is not None, "enter it first"
        return self.proxy.port

    def counters(self) -> Counters:
        """A copy, taken on the proxy's loop."""
        def copy(proxy: FaultProxy) -> Counters:
            return dataclasses.replace(proxy.counters)
        counters: Counters = self.call(copy)
        return counters
