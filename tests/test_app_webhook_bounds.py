"""What a tenant or a provider controls, bounded before it is used: a Retry-After of any size or spelling, a
host name that resolves to our own network (the refusal must not say where), a resolver that never answers,
and delivery history that would otherwise grow forever."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from vidjobs.common.dns import BoundedResolver
from vidjobs.gateway.accounts import create_account
from vidjobs.gateway.appwebhooks import deliveries
from vidjobs.gateway.appwebhooks.urls import UnsafeEndpoint, check_endpoint_url
from vidjobs.providers.http import MAX_RETRY_AFTER_S, retry_after


@pytest.mark.parametrize(("header", "seconds"), [
    ("120", 120.0), ("0", 0.0), ("-5", 0.0), ("1e300", MAX_RETRY_AFTER_S), ("inf", MAX_RETRY_AFTER_S),
    ("-inf", 0.0), ("nan", None), ("soon", None), ("9" * 400, None),
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S), ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
])
def test_retry_after_is_finite_and_at_most_a_day(header, seconds):
    assert retry_after(header) == seconds


async def test_a_refusal_never_names_the_address_a_host_resolved_to():
    with pytest.raises(UnsafeEndpoint) as refused:
        await check_endpoint_url("https://localhost:8443/hooks", frozenset())
    message = str(refused.value)
    assert "localhost" in message and "not an address on the public internet" in message
    assert "127.0.0.1" not in message and "::1" not in message and "loopback" not in message


@pytest.fixture
def stalled_dns(monkeypatch):
    """Names under .stall.test never resolve until the test ends; every other name resolves as usual."""
    released = threading.Event()
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(".stall.test"):
            released.wait(30)
            raise socket.gaierror(socket.EAI_NONAME, "released")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(BoundedResolver, "_shared", BoundedResolver(threads=2, timeout_s=0.5))
    yield
    released.set()


async def test_a_resolver_that_never_answers_costs_a_bounded_wait_and_few_threads(stalled_dns):
    threads_before = _dns_threads()
    started = time.monotonic()
    checks = [check_endpoint_url(f"https://h{n}.stall.test/hooks", frozenset()) for n in range(12)]
    async with asyncio.timeout(10):
        outcomes = await asyncio.gather(*checks, return_exceptions=True)
        # The default pool, which image decoding shares, still has its threads.
        assert await asyncio.to_thread(lambda: "free") == "free"
    assert all(isinstance(o, UnsafeEndpoint) and "did not resolve within" in str(o) for o in outcomes), outcomes
    assert time.monotonic() - started < 5
    assert _dns_threads() - threads_before <= 2  # twelve stuck names, two threads


def _dns_threads() -> int:
    return sum(t.name.startswith("dns") for t in threading.enumerate())


async def test_finished_delivery_history_is_pruned_after_its_retention(pool: asyncpg.Pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "history", credits=0, concurrency=1)
    old = datetime.now(UTC) - timedelta(days=8)
    rows = {"old-done": ("delivered", old), "old-failed": ("failed", old), "old-pending": ("pending", old),
            "new-done": ("delivered", datetime.now(UTC))}
    for name, (status, at) in rows.items():
        await pool.execute(
            "INSERT INTO webhook_deliveries (id, account_id, job_id, event_type, event_key, url, status, "
            "updated_at, next_attempt_at) VALUES ($1, $2, 'job_x', 'job.completed', $1, 'https://a.example/', $3, "
            "$4, CASE WHEN $3 = 'pending' THEN $4::timestamptz END)", f"msg_{name}", account_id, status, at)
        await pool.execute("INSERT INTO webhook_attempts (delivery_id, account_id, status, ms) VALUES ($1, $2, 500, 3)",
                           f"msg_{name}", account_id)

    removed = await deliveries.prune(pool, retention_days=7)

    left = {r["id"] for r in await pool.fetch("SELECT id FROM webhook_deliveries")}
    attempts = {r["delivery_id"] for r in await pool.fetch("SELECT delivery_id FROM webhook_attempts")}
    assert removed == 2
    assert left == attempts == {"msg_old-pending", "msg_new-done"}
