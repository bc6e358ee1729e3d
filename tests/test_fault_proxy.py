"""The fault suite's TCP proxy (tests/faults/proxy.py) between real clients and real servers: an echo server on
loopback, a PostgreSQL of the module's own under asyncpg, and a nats-server under nats-py. Piping is byte-exact
both ways; each fault does what a client would meet on a real network, and `heal` brings clean piping back.
Timings are lower bounds only (a fault can make things slower than set, never faster), with figures printed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg

from tests.faults.jsapi import wait_jetstream
from tests.faults.natsd import NatsCluster
from tests.faults.postgres import LocalPostgres
from tests.faults.proxy import MAX_HELD, FaultProxy, ProxyThread, proxied_url
from vidjobs.cli.embedded import free_port

SILENCE_S = 0.3  # how long a connection must stay unanswered to count as unanswered


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def echo_proxy(echo_port: int) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", echo_port) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalPostgres]:
    """One server for the module's PostgreSQL tests, on TCP (the shared test server may be on a unix socket, which
    a TCP proxy cannot stand in front of). None of them stalls or restarts it."""
    server = LocalPostgres(tmp_path_factory.mktemp("proxy-pg")).init().start()
    try:
        yield server
    finally:
        server.stop("immediate")


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _round_trip(port: int, payload: bytes) -> bytes:
    """Send `payload` in pieces of random sizes while reading the answer, then half-close; all that came back."""
    reader, writer = await _connect(port)

    async def send() -> None:
        view = memoryview(payload)
        while view:
            size = random.randint(1, 70_000)
            writer.write(view[:size])
            view = view[size:]
            await writer.drain()
        writer.write_eof()

    sending = asyncio.create_task(send())
    answer = await reader.read(-1)
    await sending
    writer.close()
    return answer


async def _answer(reader: asyncio.StreamReader, size: int, within_s: float = 5.0) -> bytes:
    return await asyncio.wait_for(reader.readexactly(size), within_s)


async def _unanswered(reader: asyncio.StreamReader) -> bool:
    """Nothing comes back, not even an end of stream, for SILENCE_S."""
    try:
        await asyncio.wait_for(reader.read(1), SILENCE_S)
    except TimeoutError:
        return True
    return False


async def _until(condition: Callable[[], bool], failure: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, failure
        await asyncio.sleep(0.05)


async def test_piping_is_byte_exact_both_ways_on_concurrent_connections(echo_proxy: FaultProxy):
    payloads = [os.urandom(512 * 1024 + i) for i in range(3)]
    answers = await asyncio.gather(*(_round_trip(echo_proxy.port, p) for p in payloads))
    assert [hashlib.sha256(a).digest() for a in answers] == [hashlib.sha256(p).digest() for p in payloads]
    total = sum(map(len, payloads))
    counters = echo_proxy.counters
    assert (counters.accepted, counters.bytes_up, counters.bytes_down) == (3, total, total)
    assert counters.held("up") == counters.held("down") == 0


async def test_asyncpg_runs_queries_through_the_proxy_byte_exact(postgres: LocalPostgres):
    async with FaultProxy("127.0.0.1", postgres.port) as proxy:
        conn = await asyncpg.connect(proxy.url_for(postgres.admin_url), timeout=10)
        try:
            payload = os.urandom(300_000)
            assert await conn.fetchval("SELECT $1::bytea", payload) == payload
            assert await conn.fetchval("SELECT md5($1::bytea)", payload) == hashlib.md5(payload).hexdigest()
        finally:
            await conn.close()
        assert proxy.counters.bytes_up > 2 * len(payload) and proxy.counters.bytes_down > len(payload)


async def test_an_asyncpg_connection_is_reset_and_a_new_one_after_heal_works(postgres: LocalPostgres):
    async with FaultProxy("127.0.0.1", postgres.port) as proxy:
        url = proxy.url_for(postgres.admin_url)
        conn = await asyncpg.connect(url, timeout=10)
        assert await conn.fetchval("SELECT 1") == 1
        proxy.reset()
        with pytest.raises((OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)):
            await conn.fetchval("SELECT 1")
        with pytest.raises((OSError, asyncpg.PostgresConnectionError)):
            await asyncpg.connect(url, timeout=10)
        proxy.heal()
        again = await asyncpg.connect(url, timeout=10)
        try:
            assert await again.fetchval("SELECT 2") == 2
        finally:
            await again.close()
            conn.terminate()
        assert proxy.counters.reset == 2


async def test_nats_through_the_proxy_survives_a_black_hole_and_reconnects_after_heal(nats_url: str):
    async with FaultProxy("127.0.0.1", int(nats_url.rsplit(":", 1)[1])) as proxy:
        direct = await nats.connect(nats_url)
        reconnected = asyncio.Event()

        async def on_reconnect() -> None:
            reconnected.set()

        proxied = await nats.connect(proxy.url_for(nats_url), ping_interval=0.5, max_outstanding_pings=2,
                                     reconnect_time_wait=0.2, connect_timeout=1, max_reconnect_attempts=-1,
                                     reconnected_cb=on_reconnect)
        try:
            async def respond(msg: Msg) -> None:
                await msg.respond(msg.data)

            await direct.subscribe("echo", cb=respond)
            await direct.flush()
            inbox = await proxied.subscribe("to-proxied")
            await proxied.flush()
            await direct.publish("to-proxied", b"published directly")
            assert (await inbox.next_msg(timeout=5)).data == b"published directly"
            assert (await proxied.request("echo", b"ping", timeout=5)).data == b"ping"

            proxy.black_hole()
            holed = time.monotonic()
            with pytest.raises(nats.errors.TimeoutError):
                await proxied.request("echo", b"into the hole", timeout=1)
            # Its pings go unanswered too: it gives the connection up, and its tries to reconnect meet the hole.
            await _until(lambda: not proxied.is_connected, "the client never noticed the black hole")
            noticed = time.monotonic() - holed
            await _until(lambda: proxy.counters.accepted >= 2, "the client never tried to reconnect")
            await asyncio.sleep(0.5)
            proxy.heal()
            healed = time.monotonic()
            await asyncio.wait_for(reconnected.wait(), 15)
            answer = await proxied.request("echo", b"after heal", timeout=5)
            print(f"\nnats: the client gave its connection up {noticed:.2f}s into the hole, reconnected and "
                  f"answered {time.monotonic() - healed:.2f}s after heal; "
                  f"{proxy.counters.accepted} connections accepted, {proxy.counters.dropped_up} bytes dropped "
                  f"going up, {proxy.counters.dropped_down} coming down")
            assert answer.data == b"after heal"
            assert proxy.counters.dropped_up > 0
        finally:
            await proxied.close()
            await direct.close()


async def _rtt(port: int, times: int = 5) -> list[float]:
    reader, writer = await _connect(port)
    took = []
    try:
        for i in range(times):
            started = time.monotonic()
            writer.write(b"%02d" % i)
            assert await _answer(reader, 2) == b"%02d" % i
            took.append(time.monotonic() - started)
    finally:
        writer.close()
    return took


async def test_latency_is_added_each_way_and_jitter_keeps_the_stream_in_order(echo_proxy: FaultProxy):
    clean = await _rtt(echo_proxy.port)
    echo_proxy.latency(0.1)
    latent = await _rtt(echo_proxy.port)
    echo_proxy.latency(0.05, jitter_s=0.1)
    jittery = await _rtt(echo_proxy.port)
    print(f"\nround trip: clean {statistics.median(clean) * 1000:.1f} ms, 100 ms each way "
          f"{statistics.median(latent) * 1000:.1f} ms, 50-150 ms each way {min(jittery) * 1000:.0f}-"
          f"{max(jittery) * 1000:.0f} ms")
    assert min(latent) >= 0.2 and min(jittery) >= 0.1
    payload = os.urandom(200_000)  # many chunks, each with its own jitter: still one ordered stream
    assert await _round_trip(echo_proxy.port, payload) == payload


async def test_a_throttled_megabyte_takes_at_least_its_size_over_the_rate(echo_proxy: FaultProxy):
    rate, size = 1_000_000, 1_000_000
    echo_proxy.bandwidth(rate)
    started = time.monotonic()
    answer = await _round_trip(echo_proxy.port, payload := os.urandom(size))
    took = time.monotonic() - started
    print(f"\n1 MB echoed at {rate / 1e6:.1f} MB/s each way: {took:.2f}s ({size / took / 1e6:.2f} MB/s)")
    assert answer == payload
    assert took >= size / rate


async def test_a_throttled_connection_holds_a_bounded_amount_and_heal_lifts_the_limit(echo_proxy: FaultProxy):
    echo_proxy.bandwidth(256 * 1024)
    size = 6 * 1024 * 1024
    trip = asyncio.create_task(_round_trip(echo_proxy.port, payload := os.urandom(size)))
    most = 0
    for _ in range(10):
        await asyncio.sleep(0.05)
        most = max(most, echo_proxy.counters.held("up"), echo_proxy.counters.held("down"))
    received = echo_proxy.counters.received_up
    print(f"\nthrottled to 256 KiB/s: after 0.5s {received / 1024:.0f} KiB read from the sender of "
          f"{size // 1024} KiB, at most {most / 1024:.0f} KiB held (bound {MAX_HELD // 1024} KiB)")
    assert most <= MAX_HELD and received < size / 2  # the sender met backpressure, not an endless buffer
    echo_proxy.heal()
    assert await asyncio.wait_for(trip, 20) == payload


async def test_a_black_hole_answers_nothing_keeps_connections_open_and_drops_what_it_swallowed(
        echo_proxy: FaultProxy):
    reader, writer = await _connect(echo_proxy.port)
    writer.write(b"before")
    assert await _answer(reader, 6) == b"before"
    echo_proxy.black_hole()
    writer.write(b"lost")
    late_reader, late_writer = await _connect(echo_proxy.port)  # accepted during the hole
    late_writer.write(b"early")
    assert await _unanswered(reader) and await _unanswered(late_reader)
    echo_proxy.heal()
    writer.write(b"after")
    late_writer.write(b"later")
    assert await _answer(reader, 5) == b"after"  # not "lostafter": swallowed, not delivered late
    assert await _answer(late_reader, 5) == b"later"
    assert (echo_proxy.counters.dropped_up, echo_proxy.counters.dropped_down) == (len(b"lostearly"), 0)
    writer.close()
    late_writer.close()


async def test_reset_closes_live_and_new_connections_with_rst(echo_proxy: FaultProxy):
    reader, writer = await _connect(echo_proxy.port)
    writer.write(b"hello")
    assert await _answer(reader, 5) == b"hello"
    echo_proxy.reset()
    with pytest.raises(ConnectionResetError):  # an RST, not the clean end of stream a FIN would be
        await asyncio.wait_for(reader.read(1), 5)
    new_reader, new_writer = await _connect(echo_proxy.port)  # the handshake completes; the RST follows
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(new_reader.read(1), 5)
    await _until(lambda: echo_proxy.live == 0, "a reset connection is still live")
    assert echo_proxy.counters.reset == 2
    echo_proxy.heal()
    assert await _round_trip(echo_proxy.port, b"again") == b"again"
    writer.close()
    new_writer.close()


async def test_refused_connects_while_live_ones_carry_on_and_heal_listens_on_the_same_port(
        echo_proxy: FaultProxy):
    port = echo_proxy.port
    reader, writer = await _connect(port)
    echo_proxy.refuse()
    with pytest.raises(ConnectionRefusedError):
        await _connect(port)
    writer.write(b"still here")
    assert await _answer(reader, 10) == b"still here"
    echo_proxy.heal()
    assert echo_proxy.port == port
    assert await _round_trip(port, b"back") == b"back"
    writer.close()


async def test_a_connection_to_an_unreachable_target_is_reset():
    async with FaultProxy("127.0.0.1", free_port()) as proxy:  # nothing listens there
        reader, writer = await _connect(proxy.port)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), 5)
        writer.close()
        await _until(lambda: proxy.live == 0, "the link outlived its failed connect")
        assert proxy.counters.accepted == 1


async def test_a_proxy_on_a_thread_of_its_own_pipes_and_takes_faults(echo_port: int):
    with ProxyThread("127.0.0.1", echo_port) as proxied:
        assert await _round_trip(proxied.port, b"threaded") == b"threaded"
        reader, writer = await _connect(proxied.port)
        proxied.call(FaultProxy.black_hole)
        writer.write(b"lost")
        assert await _unanswered(reader)
        proxied.call(FaultProxy.heal)
        writer.write(b"found")
        assert await _answer(reader, 5) == b"found"
        writer.close()
        counters = proxied.counters()
        assert (counters.accepted, counters.dropped_up) == (2, 4)


def test_urls_are_pointed_at_the_proxy_with_the_rest_kept():
    assert proxied_url("postgresql://u:p@127.0.0.1:5432/db?sslmode=disable", "127.0.0.1", 41000) == \
        "postgresql://u:p@127.0.0.1:41000/db?sslmode=disable"
    assert proxied_url("nats://127.0.0.1:4222", "127.0.0.1", 41001) == "nats://127.0.0.1:41001"
    assert proxied_url("http://127.0.0.1:9000", "127.0.0.1", 41002) == "http://127.0.0.1:41002"
    proxy = FaultProxy("127.0.0.1", 5432, 41003)
    assert proxy.url_for("postgresql://u@127.0.0.1:5432/db") == "postgresql://u@127.0.0.1:41003/db"
    with pytest.raises(ValueError):
        proxy.url_for("nats://127.0.0.1:4222")


@pytest.mark.parametrize("advertise", [True, False])
async def test_a_client_given_proxied_cluster_urls_learns_no_direct_route_to_a_node(tmp_path, advertise: bool):
    """The nemesis hands the services every node's URL through a proxy of its own. A cluster that advertises its
    nodes' client URLs would let a reconnecting client skip the proxy (and so the partition the proxy holds);
    without advertising, the client knows only what it was given."""
    cluster = NatsCluster(tmp_path, advertise=advertise).start()
    try:
        with contextlib.ExitStack() as proxies:
            urls = [proxied_url(node.url, "127.0.0.1", proxies.enter_context(ProxyThread("127.0.0.1", node.port)).port)
                    for node in cluster.nodes]
            await wait_jetstream(urls)  # the cluster is routed: each node knows the others' client URLs
            nc = await nats.connect(urls, connect_timeout=5)
            try:
                await nc.flush()
                await _until(lambda: not advertise or len(nc.discovered_servers) == len(cluster.nodes),
                             "the advertising cluster's nodes were never discovered")
                learned = {f"{u.hostname}:{u.port}" for u in nc.discovered_servers}
            finally:
                await nc.close()
    finally:
        cluster.stop()
    direct = {f"127.0.0.1:{node.port}" for node in cluster.nodes}
    assert bool(learned & direct) is advertise
