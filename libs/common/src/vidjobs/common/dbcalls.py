"""The client side's bound on a database call, and the connection a stuck call leaves behind.

The server's own timeouts (db.Timeouts) end a slow statement, but not a server that has stopped answering
altogether (a stalled disk, a paused VM, a half-open connection): then only the client can give up. A call
is one use of a pooled connection, from asking the pool for it to handing it back (`pool.fetchrow(...)`, or
`async with pool.acquire() as conn:` and all that is done inside, a transaction included).

- `bounded(seconds)` gives every call made inside it (by this task, and by the tasks it starts) one deadline
  of `seconds`, the wait for a free connection included: the gateway wraps each request in it, so a client
  hears `unavailable` in seconds rather than waiting out the stall. Outside it a call has no deadline of its
  own; each statement is still bounded by the pool's command timeout and a wait for a connection by the
  pool's acquire timeout (`BoundedPool`).
- A call that ran out of time, by either bound, or was cancelled, leaves its connection in an unknown state
  (a statement may still be running, or the server may answer it later): the connection is terminated, never
  handed back to the pool for the next call to wait on. The pool opens a fresh one when it needs one.

The error is the TimeoutError a bound raises, which vidjobs.common.faults counts as an infrastructure
fault: workers defer the work, the gateway answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import asyncpg
from asyncpg.pool import PoolAcquireContext, PoolConnectionProxy

if TYPE_CHECKING:
    _Acquiring = PoolAcquireContext[asyncpg.Record]
else:
    _Acquiring = PoolAcquireContext  # generic only in asyncpg's stubs

_BOUND: ContextVar[float | None] = ContextVar("vidjobs_db_call_bound", default=None)


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Every database call made inside ends within `seconds`, or raises TimeoutError."""
    token = _BOUND.set(seconds)
    try:
        yield
    finally:
        _BOUND.reset(token)


def current_bound() -> float | None:
    return _BOUND.get()


class BoundedPool(asyncpg.Pool):
    """An asyncpg pool whose calls keep to `bounded` and abandon a connection stuck in a call. A wait for a
    connection outside `bounded` ends after `acquire_timeout_s`."""

    def __init__(self, *args: Any, acquire_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acquire_timeout_s = acquire_timeout_s

    def acquire(self, *, timeout: float | None = None) -> PoolAcquireContext[asyncpg.Record]:
        return _Call(self, self._acquire_timeout_s if timeout is None else timeout, _BOUND.get())


class _Call(_Acquiring):
    """One call: a connection from the pool, used and handed back under one deadline."""

    def __init__(self, pool: BoundedPool, timeout: float, bound: float | None) -> None:
        super().__init__(pool, timeout)
        self._deadline = asyncio.timeout(bound)  # None: no deadline of its own

    async def __aenter__(self) -> PoolConnectionProxy[asyncpg.Record]:
        await self._deadline.__aenter__()
        try:
            return await super().__aenter__()
        except BaseException as exc:
            await self._deadline.__aexit__(type(exc), exc, exc.__traceback__)  # raises TimeoutError if it ran out
            raise

    async def __aexit__(self, *exc: Any) -> None:
        exc_type = exc[0] if exc else None
        stuck = exc_type is not None and issubclass(exc_type, (TimeoutError, asyncio.CancelledError))
        try:
            await self._deadline.__aexit__(*exc)
        except TimeoutError:
            stuck = True
            raise
        finally:
            if stuck and self.connection is not None:
                # Not reset and reused: the reset would wait on the very server that stopped answering.
                self.connection.terminate()
            await super().__aexit__(*exc)
