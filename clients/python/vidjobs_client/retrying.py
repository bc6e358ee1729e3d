"""When to try a request again, and how long to wait first.

A refusal the API marks retryable (429, 503) is tried again after its `Retry-After`, or after a backoff that
doubles with jitter when it names none. A connection that could not be opened is always safe to retry; one that
broke after the request went out is retried only for a call that may be sent twice. The number of tries and the
longest wait are bounded: past them the error reaches the caller.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from .calls import Call
from .errors import APIError, ConnectionFailed

_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 4  # tries in all, the first included
    backoff_s: float = 0.5  # the first wait when the API names none; doubles each time
    max_backoff_s: float = 8.0
    max_retry_after_s: float = 60.0  # a longer Retry-After is not waited out: the error is raised at once
    # A stream that drops is reopened this many times in a row (about 30 s of backoff: a gateway restart)
    # before following the job gives up; a connection that delivers an event starts the count again.
    reconnects: int = 8
    # Told the reason and the wait before each retry (a CLI says why it pauses); None: retry quietly.
    on_retry: Callable[[str, float], None] | None = None

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    def after_refusal(self, call: Call[Any], attempt: int, error: APIError) -> float:
        """Seconds to wait before the next try, or raise `error` when there is none."""
        # 429 and 503 mean the request was not acted on; a proxy's 502 or 504 may hide one that was.
        safe = error.status in (429, 503) or (error.status in (502, 504) and call.replayable)
        if attempt >= self.attempts or not error.retryable or not safe:
            raise error
        wait = error.retry_after_s if error.retry_after_s is not None else self._backoff(attempt)
        if wait > self.max_retry_after_s:
            raise error
        return self._told(f"{error.code} (HTTP {error.status})", wait)

    def after_failure(self, call: Call[Any], attempt: int, failure: httpx.TransportError) -> float:
        """Seconds to wait before the next try, or raise `ConnectionFailed` when there is none."""
        if attempt >= self.attempts or not (call.replayable or isinstance(failure, _NEVER_SENT)):
            raise ConnectionFailed(f"{call.method} {call.path}: {type(failure).__name__}: {failure or 'no answer'}"
                                   f" (after {attempt} {'try' if attempt == 1 else 'tries'})") from failure
        return self._told(f"{type(failure).__name__} on {call.method} {call.path}", self._backoff(attempt))

    def _told(self, reason: str, wait: float) -> float:
        if self.on_retry is not None:
            self.on_retry(reason, wait)
        return wait
