"""The fake provider's weather: how the whole provider behaves, whatever a render's own scenario asks, set and
cleared at any moment (`PUT /v1/_weather`). A real provider has outages that are not any one render's: its API
slow, rate limiting everyone, answering 500 or 503, its callbacks sent twice or late. The fault runs switch
these on and off while jobs are in flight.

The API weather covers the calls an adapter makes about renders (`/v1/renders...`); the counters, health and
weather routes are never affected, so a test can always read what happened and end the weather."""

from __future__ import annotations

import asyncio
import enum

import msgspec

from vidjobs.fakeprovider.wire import ApiFailure

MAX_DELAY_S = 30.0  # a slow answer, or a late callback, is held at most this long


class Api(enum.StrEnum):
    CLEAR = "clear"
    SLOW = "slow"  # every answer waits `delay_s` first
    RATE_LIMITED = "rate_limited"  # 429 with Retry-After: 1
    UNAVAILABLE = "unavailable"  # 503
    FAILING = "failing"  # 500


class Callbacks(enum.StrEnum):
    NORMAL = "normal"
    TWICE = "twice"  # every callback also re-sent under a new id, and the original retried late
    LATE = "late"  # every callback waits `delay_s` before its first try


class Weather(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    api: Api = Api.CLEAR
    callbacks: Callbacks = Callbacks.NORMAL
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.delay_s <= MAX_DELAY_S:
            raise msgspec.ValidationError(f"delay_s must be between 0 and {MAX_DELAY_S:g}")


_REFUSALS = {
    Api.RATE_LIMITED: (429, "rate_limited", "Too many requests.", {"Retry-After": "1"}),
    Api.UNAVAILABLE: (503, "unavailable", "The service is unavailable.", {}),
    Api.FAILING: (500, "internal", "Internal error.", {}),
}


async def weather_the_call(weather: Weather, path: str) -> None:
    """What the weather does to one call before it is handled: nothing, a wait, or a refusal raised."""
    if not path.startswith("/v1/renders") or weather.api is Api.CLEAR:
        return
    if weather.api is Api.SLOW:
        await asyncio.sleep(weather.delay_s)
        return
    status, code, message, headers = _REFUSALS[weather.api]
    raise ApiFailure(status, code, message, headers=headers)


def decode_weather(body: bytes) -> Weather:
    try:
        return msgspec.json.decode(body, type=Weather)
    except msgspec.DecodeError as exc:
        raise ApiFailure(400, "invalid_request", str(exc)) from None
