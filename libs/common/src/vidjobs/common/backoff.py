"""Repeating a call in this process after a failure that may pass: exponential backoff with full jitter,
bounded by a number of attempts and by time, and only for the failures named.

"Backoff" is a call made again here and now; a job's new attempt is a "retry" (common/retry.py), and a
message handed back to the bus is redelivered (common/bus.py). Modelled on stamina: the caller names what
may be repeated, everything else propagates at once.

    policy = Backoff(on=faults.INFRASTRUCTURE, attempts=None, timeout=15.0, base=0.5, cap=3.0)
    row = await call(policy, lambda attempt: record(conn))
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Which failures may be repeated: exception types, or a predicate for those a type alone does not tell apart
# (a provider error whose outcome is unclear, say).
Repeatable = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
# Told of each failure that will be repeated: the error, the attempt that failed, the wait before the next.
OnBackoff = Callable[[BaseException, int, float], None]


def delay(attempt: int, *, base: float = 0.5, cap: float = 30.0) -> float:
    """The wait before repeating after failed attempt `attempt` (1, 2, ...): exponential backoff with full
    jitter, uniform in [0, min(cap, base * 2 ** (attempt - 1))]."""
    return random.uniform(0, min(cap, base * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Backoff:
    """When a failed call is made again. `attempts` counts calls (None: no bound by count); `timeout` bounds
    the seconds from the first call after which no call starts (None: no bound by time). At least one bound
    must be set, so that a failure that never passes still ends."""

    on: Repeatable
    attempts: int | None = 10
    timeout: float | None = 45.0
    base: float = 0.1  # the first wait's bound; each later one doubles it
    cap: float = 5.0  # no wait is longer

    def __post_init__(self) -> None:
        if self.attempts is None and self.timeout is None:
            raise ValueError("a backoff needs a bound: attempts, timeout or both")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("attempts counts calls: at least 1")

    def repeats(self, exc: BaseException) -> bool:
        """Whether `exc` is a failure this policy repeats."""
        if isinstance(self.on, type | tuple):
            return isinstance(exc, self.on)
        return self.on(exc)

    def wait_after(self, exc: BaseException, attempt: int, elapsed: float) -> float | None:
        """How long to wait before the call after failed attempt `attempt`, `elapsed` seconds after the
        first began; None when it is not to be repeated (not named, or out of attempts or time). A wait never
        runs past the time bound."""
        if not self.repeats(exc) or (self.attempts is not None and attempt >= self.attempts):
            return None
        wait = delay(attempt, base=self.base, cap=self.cap)
        if self.timeout is None:
            return wait
        left = self.timeout - elapsed
        return None if left <= 0 else min(wait, left)


async def call(
    policy: Backoff, fn: Callable[[int], Awaitable[T]], *, on_backoff: OnBackoff | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, clock: Callable[[], float] = time.monotonic,
) -> T:
    """`fn(attempt)`'s result (attempt 1, 2, ...), calling it again after each failure `policy` repeats;
    the last failure propagates. `sleep` and `clock` are the waits and the time the bounds are measured by."""
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await fn(attempt)
        except Exception as exc:
            wait = policy.wait_after(exc, attempt, clock() - started)
            if wait is None:
                raise
            if on_backoff is not None:
                on_backoff(exc, attempt, wait)
        await sleep(wait)
