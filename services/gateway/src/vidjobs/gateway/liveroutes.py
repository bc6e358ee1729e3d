"""The model routes a gateway picks from, kept in memory and kept current.

A create picks its route from memory (vidjobs.providers.rollout): no database call per job. The table is
read again when PostgreSQL announces a change (LISTEN on modelroutes.CHANNEL, raised by a trigger at the
commit of any change of model_routes), and every VIDJOBS_ROUTES_REFRESH_S in any case, so a gateway whose
listening connection dropped, or that missed an announcement, is never behind by more than that. A read that
fails keeps the table it had: routing goes on by the last shares known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from vidjobs.common import modelroutes
from vidjobs.common.modelroutes import AliasRoutes
from vidjobs.common.waits import set_within
from vidjobs.providers import rollout

log = logging.getLogger("vidjobs.gateway.routes")

_CONNECT_TIMEOUT_S = 5.0


class LiveRoutes:
    def __init__(self, pool: asyncpg.Pool, database_url: str, usable: frozenset[str], refresh_s: float):
        self._pool = pool
        self._url = database_url
        self._usable = usable  # the models this gateway's adapters render; other routes are passed over
        self._refresh_s = max(refresh_s, 0.1)  # a zero would reread without pause
        self._changed = asyncio.Event()
        self._listener: asyncpg.Connection | None = None
        self.table: dict[str, AliasRoutes] = {}

    def route(self, model: str, account_id: str) -> tuple[str, str | None]:
        """(the real model, the alias it came through or None): the account's sticky pick."""
        return rollout.route(model, self.table, account_id)

    def aliases(self) -> dict[str, list[str]]:
        return rollout.aliases_of(self.table)

    async def load(self) -> None:
        found = await modelroutes.rows(self._pool)
        table = modelroutes.table_of(found, self._usable)
        if table != self.table:
            skipped = sorted({f"{r.alias} -> {r.model}" for r in found
                              if r.enabled and r.share > 0 and r.model not in self._usable})
            log.info("model routes read", extra={
                "aliases": {a: [f"{s.model}={s.share}" for s in r.shares] for a, r in table.items()},
                "versions": {a: r.version for a, r in table.items()},
                **({"not_offered_here": skipped} if skipped else {})})
        self.table = table

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: reread on every announcement, and every refresh interval."""
        try:
            while not stop.is_set():
                await self._listen()
                await set_within(self._changed, self._refresh_s)
                self._changed.clear()
                try:
                    await self.load()
                except Exception as exc:  # whatever kept the read from answering, the gateway routes on
                    log.warning("model routes not read; routing by the last ones read", extra={"error": repr(exc)})
        finally:
            await self._close_listener()

    async def _listen(self) -> None:
        """A connection of its own that LISTENs (the pool's sessions keep no state); made again if lost, and
        the table read once it listens, so a change made while it was away is not missed."""
        if self._listener is not None and not self._listener.is_closed():
            return
        await self._close_listener()
        try:
            conn = await asyncpg.connect(self._url, timeout=_CONNECT_TIMEOUT_S,
                                         server_settings={"application_name": "vidjobs-gateway"})
            await conn.add_listener(modelroutes.CHANNEL, self._announced)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("model routes: not listening for changes; rereading every interval",
                        extra={"error": repr(exc), "refresh_s": self._refresh_s})
            return
        self._listener = conn
        self._changed.set()

    def _announced(self, *_: object) -> None:
        self._changed.set()

    async def _close_listener(self) -> None:
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(listener.close(), _CONNECT_TIMEOUT_S)
