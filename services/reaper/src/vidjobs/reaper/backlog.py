"""How many messages the submitter has not been handed yet (its consumer's `num_pending`), read at most once
per `ttl_s` for all of this reaper's recovery checks. A waiting job whose first message is still among them
needs no second one (recovery.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
from nats.js import JetStreamContext

from vidjobs.common import bus, events

log = logging.getLogger("vidjobs.reaper")


class SubmitQueue:
    def __init__(self, js: JetStreamContext, *, ttl_s: float = 2.0):
        self._js = js
        self._ttl_s = ttl_s
        self._read_at = -float("inf")
        self._waiting = 0
        self._lock = asyncio.Lock()

    async def waiting(self) -> int:
        """Messages on the submit subject the submitter has not been handed; 0 when JetStream cannot say,
        so a check then errs towards sending the job's message again (harmless: handled as a duplicate)."""
        async with self._lock:
            if time.monotonic() - self._read_at >= self._ttl_s:
                self._waiting = await self._read()
                self._read_at = time.monotonic()
            return self._waiting

    async def _read(self) -> int:
        try:
            info = await self._js.consumer_info(bus.WORK_STREAM, events.SUBMIT_DURABLE, timeout=2)
        except (nats.errors.Error, TimeoutError) as exc:
            log.warning("could not read the submitter's queue", extra={"error": repr(exc)})
            return 0
        return info.num_pending or 0
