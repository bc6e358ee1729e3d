"""The rate card: credits per second of video by model and resolution, in numbered versions.

A job is priced by the newest card when it is created and keeps that version, so a price change never
alters what a waiting job was quoted. The most specific price wins: the exact model, then `<provider>/*`,
then `*`. A provider's reported cost (in USD) becomes credits at the card's `credits_per_usd`.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Literal

import asyncpg
import msgspec
from msgspec import Meta

from vidjobs.common.errors import StoreError
from vidjobs.common.jobs import JobRequest

Resolution = Literal["480p", "720p", "1080p"]


class Price(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: Annotated[str, Meta(pattern=r"^(\*|[a-z0-9][a-z0-9_-]*/(\*|[A-Za-z0-9][A-Za-z0-9._:/-]*))$")]
    resolution: Resolution
    credits_per_second: Annotated[float, Meta(gt=0)]


class RateCardIn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A new card as an operator writes it (`vidjobs rates set FILE`)."""

    credits_per_usd: Annotated[float, Meta(gt=0)]
    prices: Annotated[list[Price], Meta(min_length=1)]
    note: str = ""


class RateCard(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    credits_per_usd: float
    prices: list[Price]
    note: str
    created_at: datetime


class Unpriced(StoreError):
    """The card has no price for this model at this resolution."""


def _candidates(model: str) -> list[str]:
    return [model, f"{model.split('/', 1)[0]}/*", "*"]


def price_of(card: RateCard, model: str, resolution: str) -> Price:
    table: dict[tuple[str, str], Price] = {(p.model, p.resolution): p for p in card.prices}
    for candidate in _candidates(model):
        if (found := table.get((candidate, resolution))) is not None:
            return found
    raise Unpriced(f"rate card v{card.version} has no price for {model} at {resolution}")


def estimate(card: RateCard, request: JobRequest) -> int:
    """Whole credits, rounded up: a quote is never below the price."""
    price = price_of(card, request.model, request.resolution)
    return math.ceil(round(price.credits_per_second * request.duration_s, 6))


def usd_to_credits(card_credits_per_usd: float, usd: float) -> int:
    return max(0, math.ceil(round(usd * card_credits_per_usd, 6)))


async def _load(conn: asyncpg.Connection | asyncpg.Pool, version: int | None) -> RateCard:
    head = await conn.fetchrow(
        """
        SELECT version, credits_per_usd, note, created_at FROM rate_cards
        WHERE $1::integer IS NULL OR version = $1 ORDER BY version DESC LIMIT 1
        """,
        version,
    )
    if head is None:
        raise StoreError("no rate card" if version is None else f"no rate card v{version}")
    rows = await conn.fetch(
        "SELECT model, resolution, credits_per_second::float8 AS credits_per_second FROM rate_card_prices "
        "WHERE version = $1 ORDER BY model, resolution",
        head["version"],
    )
    return RateCard(prices=[Price(**dict(r)) for r in rows], **dict(head))


async def current(conn: asyncpg.Connection | asyncpg.Pool) -> RateCard:
    return await _load(conn, None)


async def version(conn: asyncpg.Connection | asyncpg.Pool, number: int) -> RateCard:
    return await _load(conn, number)


async def publish(conn: asyncpg.Connection, card: RateCardIn) -> int:
    """Store `card` as the next version; jobs created from now on are priced by it."""
    duplicates = {(p.model, p.resolution) for p in card.prices}
    if len(duplicates) != len(card.prices):
        raise StoreError("the card prices some model and resolution twice")
    async with conn.transaction():
        # Two operators publishing at once get consecutive versions, not a clash.
        await conn.execute("LOCK TABLE rate_cards IN SHARE ROW EXCLUSIVE MODE")
        number: int = await conn.fetchval("SELECT COALESCE(max(version), 0) + 1 FROM rate_cards")
        await conn.execute("INSERT INTO rate_cards (version, credits_per_usd, note) VALUES ($1, $2, $3)",
                           number, card.credits_per_usd, card.note)
        await conn.executemany(
            "INSERT INTO rate_card_prices (version, model, resolution, credits_per_second) VALUES ($1, $2, $3, $4)",
            [(number, p.model, p.resolution, p.credits_per_second) for p in card.prices],
        )
    return number


async def provider_cost_credits(conn: asyncpg.Connection, version_number: int | None, usd: float) -> int:
    """A provider's reported cost, in credits at the rate of the card the job was priced with."""
    per_usd = await conn.fetchval(
        "SELECT credits_per_usd FROM rate_cards WHERE version = COALESCE($1::integer, "
        "(SELECT max(version) FROM rate_cards))",
        version_number,
    )
    return usd_to_credits(per_usd, usd)

