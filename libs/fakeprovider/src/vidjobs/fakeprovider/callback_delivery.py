"""Callbacks as the fake provider sends them: signed with Standard Webhooks headers, one render's in the order
they were made, and tried again with backoff on connection errors, 429 and 5xx (another 4xx is a refusal that
asking again will not change)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp

from vidjobs.common import signatures
from vidjobs.fakeprovider.wire import bump

log = logging.getLogger("vidjobs.fake_provider")


@dataclass
class CallbackCourier:
    secret: str
    attempts: int = 4
    backoff_s: float = 0.25  # before the second try; each further wait is three times the last
    delivered: dict[str, int] = field(default_factory=dict)  # deliveries answered 2xx, by render id

    async def send_after(self, session: aiohttp.ClientSession, previous: asyncio.Task[None] | None,
                         render_id: str, url: str, body: bytes, *, repeat: bool, late_s: float = 0.0) -> None:
        """Send `body` once `previous` (the render's last callback) is done, `late_s` after; `repeat` sends it
        three times."""
        if previous is not None:
            await asyncio.wait([previous])
        if late_s:
            await asyncio.sleep(late_s)
        msg_id = signatures.new_message_id()
        if not repeat:
            await self.send(session, render_id, url, body, msg_id)
            return
        # The same event three times: a re-emission under a new id racing the original, then a late retry of
        # the original (same id), as a provider that lost track of its acks would send.
        await asyncio.gather(self.send(session, render_id, url, body, msg_id),
                             self.send(session, render_id, url, body, signatures.new_message_id()))
        await asyncio.sleep(0.05)
        await self.send(session, render_id, url, body, msg_id)

    async def send(self, session: aiohttp.ClientSession, render_id: str, url: str, body: bytes,
                   msg_id: str) -> None:
        outcome: int | str = "not tried"
        for attempt in range(1, self.attempts + 1):
            headers = {"Content-Type": "application/json",
                       **signatures.signed_headers(self.secret, body, msg_id=msg_id)}
            outcome = await _post(session, url, body, headers)
            if isinstance(outcome, int) and outcome < 300:
                bump(self.delivered, render_id)
                log.info("callback delivered", extra={"render_id": render_id, "webhook_id": msg_id})
                return
            if isinstance(outcome, int) and outcome < 500 and outcome != 429:
                log.warning("callback refused", extra={"render_id": render_id, "status": outcome})
                return  # the receiver said no; asking again will not change its mind
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff_s * 3 ** (attempt - 1))
        log.warning("callback undeliverable", extra={"render_id": render_id, "webhook_id": msg_id,
                                                     "last": str(outcome)})


async def _post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> int | str:
    """The receiver's status code, or what went wrong on the way there."""
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            return resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return repr(exc)
