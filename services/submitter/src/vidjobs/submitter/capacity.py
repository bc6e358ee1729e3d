"""A provider's capacity, held in PostgreSQL so every submitter replica obeys the same one: its renders and
calls in flight, counted against its concurrency cap, and its request-rate bucket. Both are read and spent
under the provider's lock (`slots`)."""

from __future__ import annotations

import asyncpg

from vidjobs.common import inflight
from vidjobs.common.settings import ProviderLimits
from vidjobs.common.states import SQL_RENDERING


async def in_flight(conn: asyncpg.Connection | asyncpg.Pool, provider: str, claim_ttl_s: float) -> int:
    """Renders this provider is working on for us, and calls to it still waiting for an answer."""
    count: int = await conn.fetchval(
        f"""
        SELECT (SELECT count(*) FROM jobs
                WHERE provider = $1 AND status IN {SQL_RENDERING} AND deleted_at IS NULL)
             + (SELECT count(*) FROM provider_submissions
                WHERE provider = $1 AND {inflight.unanswered_call("$2")})
        """,
        provider, claim_ttl_s,
    )
    return count


async def take_token(conn: asyncpg.Connection, provider: str, limits: ProviderLimits) -> float | None:
    """Spend one token of the provider's bucket; None if there was one, else how long until there is."""
    tokens: float = await conn.fetchval(
        """
        INSERT INTO provider_rate_buckets AS b (provider, tokens) VALUES ($1, $3)
        ON CONFLICT (provider) DO UPDATE SET
            tokens = LEAST($3, b.tokens + $2 * extract(epoch FROM clock_timestamp() - b.updated_at)),
            updated_at = clock_timestamp()
        RETURNING tokens
        """,
        provider, limits.rate_per_s, float(limits.burst),
    )
    if tokens < 1:
        return (1 - tokens) / limits.rate_per_s
    await conn.execute("UPDATE provider_rate_buckets SET tokens = tokens - 1 WHERE provider = $1", provider)
    return None
