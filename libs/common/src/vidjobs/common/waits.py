"""Waiting for an event with a bound, without ever losing a cancellation.

On Python 3.11, `asyncio.wait_for(event.wait(), timeout)` returns normally when the task is cancelled in the
moment the event is set (CPython gh-86296; 3.12 rewrote wait_for): the cancel is swallowed, and a loop that
stops on cancellation goes round again, its canceller waiting for it forever. `set_within` waits under
`asyncio.timeout`, which delivers a cancel that arrives as the event is set.
"""

from __future__ import annotations

import asyncio


async def set_within(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `event` is set or `timeout_s` passes; whether it was set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
