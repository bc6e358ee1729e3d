"""Name lookups for URLs someone else chose (webhook endpoints, render downloads), bounded in time and in
threads.

getaddrinfo blocks a thread until the system resolver answers, and a resolver that never answers never gives
the thread back. In the loop's default pool those threads are the ones image decoding and file work use, so
a few hostile names could stall them all. Here lookups run on a few threads of their own, each waits at most
`timeout_s`, and a thread still stuck in a lookup keeps its place: once every place is taken, further
lookups fail after their wait rather than queue behind the stuck ones.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from aiohttp.abc import AbstractResolver, ResolveResult

DEFAULT_THREADS = 4
DEFAULT_TIMEOUT_S = 5.0
_NUMERIC = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV
_T = TypeVar("_T")

# One answer of getaddrinfo: family, socket type, protocol, canonical name and the address. An IPv6 address
# comes as (host, port, flow info, scope id), or as (int, bytes) from a Python built without IPv6.
AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str,
                 tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]]


class LookupTimeout(OSError):
    """A name did not resolve in time; an OSError, as a failed lookup is to every caller."""


class BoundedResolver(AbstractResolver):
    _shared: BoundedResolver | None = None

    def __init__(self, threads: int = DEFAULT_THREADS, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dns")
        self._places = asyncio.BoundedSemaphore(threads)
        self.timeout_s = timeout_s

    @classmethod
    def shared(cls) -> BoundedResolver:
        """The process's resolver (made on first use, with `configure`'s figures if it was called first)."""
        if cls._shared is None:
            cls._shared = cls()
        return cls._shared

    @classmethod
    def configure(cls, threads: int, timeout_s: float) -> None:
        cls._shared = cls(threads, timeout_s)

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        infos = await self._lookup(host, port, family)
        return [result for info in infos if (result := _result(host, info)) is not None]

    async def _lookup(self, host: str, port: int, family: socket.AddressFamily) -> Sequence[AddrInfo]:
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._places.acquire()
                future = asyncio.get_running_loop().run_in_executor(
                    self._pool, socket.getaddrinfo, host, port, family, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG)
                future.add_done_callback(self._thread_back)
                return await asyncio.shield(future)
        except TimeoutError as exc:
            raise LookupTimeout(f"{host} did not resolve within {self.timeout_s:g} s") from exc

    def _thread_back(self, future: asyncio.Future[_T]) -> None:
        # The place is given back when the thread is, not when we stopped waiting for it; a lookup given up
        # on has its outcome read here, so nothing is left unretrieved.
        self._places.release()
        if not future.cancelled():
            future.exception()

    async def close(self) -> None:
        """Shared by every session of the process: nothing to release per session."""


def _result(host: str, info: AddrInfo) -> ResolveResult | None:
    """The answer as aiohttp connects to it; None for one it cannot (the IPv6 form of a Python without IPv6)."""
    family, _, proto, _, address = info
    ip, port = address[0], address[1]
    if not (isinstance(ip, str) and isinstance(port, int) and family in (socket.AF_INET, socket.AF_INET6)):
        return None
    return ResolveResult(hostname=host, host=ip, port=port, family=family, proto=proto, flags=_NUMERIC)
