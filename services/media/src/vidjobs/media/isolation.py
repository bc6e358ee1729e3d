"""Decoding a render that may have killed a media process before is done alone.

When a process dies while decoding, every render it was decoding at that moment is suspect, and only one of
them is to blame. A suspect is therefore decoded with no other decode beside it: if it kills the process
again, the blame is certain and the render is given up on (`worker.DECODER_CRASHES`); if it was an innocent
bystander, it decodes fine and completes. Ordinary decodes share the transcoder as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class DecodeGate:
    """A readers-writer gate: ordinary decodes share it, a suspect's decode holds it alone. Waiting suspects
    go before newly arriving ordinary decodes, so a suspect is never starved."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._shared = 0
        self._alone = False
        self._suspects_waiting = 0

    @contextlib.asynccontextmanager
    async def enter(self, *, suspect: bool) -> AsyncIterator[None]:
        if suspect:
            async with self._alone_held():
                yield
        else:
            async with self._shared_held():
                yield

    @contextlib.asynccontextmanager
    async def _shared_held(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone and not self._suspects_waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def _alone_held(self) -> AsyncIterator[None]:
        async with self._changed:
            self._suspects_waiting += 1
            try:
                await self._changed.wait_for(lambda: not self._alone and self._shared == 0)
            finally:
                self._suspects_waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()
