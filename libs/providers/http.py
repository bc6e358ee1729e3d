"""HTTP details every provider adapter shares."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import aiohttp

from libs.common.errors import ErrorCode, ProviderError


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date. None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


@contextlib.asynccontextmanager
async def transport_errors(
    provider: str, method: str, path: str, *, detail: bool = True,
) -> AsyncIterator[None]:
    """A call that never reached an answer, in our taxonomy. `detail=False` keeps the library's message
    out of ours, for providers whose URLs or headers must never be echoed."""
    try:
        yield
    except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
        raise ProviderError(ErrorCode.TIMEOUT, f"{provider} did not answer {method} {path} in time.",
                            unclear=True) from exc
    except aiohttp.ClientError as exc:
        said = str(exc) if detail else type(exc).__name__
        raise ProviderError(ErrorCode.PROVIDER_UNAVAILABLE, f"{provider} could not be reached: {said}",
                            unclear=sent_maybe(exc)) from exc


def sent_maybe(exc: aiohttp.ClientError) -> bool:
    """Whether a failed call may have reached the provider: only a connection that was never made (refused,
    unresolvable, TLS refused) proves the request was not sent."""
    return not isinstance(exc, aiohttp.ClientConnectorError)
