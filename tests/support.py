"""Helpers shared by tests."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at another database (keeps host, socket query and credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def wait_until(predicate, *, within: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll an async predicate until it returns something truthy; fail naming `what` if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last value: {value!r}")
        await asyncio.sleep(interval)
