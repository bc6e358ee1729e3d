"""Submitting politely: a concurrency cap, a request-rate bucket and a circuit breaker per provider, held in
PostgreSQL so every submitter replica obeys the same ones.

Every decision for one provider runs under that provider's transaction-scoped advisory lock, together with
the claim of the submission row it admits, so two replicas can never both take the last slot or token. Every
submitter transaction that writes for a provider takes that lock first, which also gives all of them one
lock order (provider, job, submission, breaker) and so no deadlocks.
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import msgspec

from vidjobs.common import outbox, waiting
from vidjobs.common.breakers import BreakerState
from vidjobs.common.errors import ErrorCode
from vidjobs.common.settings import ProviderLimits, Settings
from vidjobs.common.states import SQL_RENDERING

MAX_COOLDOWN_S = 600.0


class Admission(msgspec.Struct, frozen=True):
    """Go ahead (`wait_s` None), or wait that long for the reason given."""

    wait_s: float | None = None
    reason: str | None = None
    kind: str = "go"  # breaker | concurrency | rate: a bounded metric label
    probe: bool = False  # this job tests whether a paused provider is back


GO = Admission()


def limits_for(settings: Settings, provider: str) -> ProviderLimits:
    return settings.limits_for(provider)  # one definition, which the estimates of waiting jobs read too


async def lock_provider(conn: asyncpg.Connection, provider: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.provider'), hashtext($1))", provider)


async def in_flight(conn: asyncpg.Connection, provider: str, claim_ttl_s: float) -> int:
    """Renders this provider is working on for us, and calls to it still waiting for an answer."""
    return await conn.fetchval(
        f"""
        SELECT (SELECT count(*) FROM jobs
                WHERE provider = $1 AND status IN {SQL_RENDERING} AND deleted_at IS NULL)
             + (SELECT count(*) FROM provider_submissions
                WHERE provider = $1 AND answered_at IS NULL
                  AND claimed_at > clock_timestamp() - make_interval(secs => $2))
        """,
        provider, claim_ttl_s,
    )


async def take_token(conn: asyncpg.Connection, provider: str, limits: ProviderLimits) -> float | None:
    """Spend one token of the provider's bucket; None if there was one, else how long until there is."""
    tokens = await conn.fetchval(
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


async def breaker_pausing(conn: asyncpg.Connection | asyncpg.Pool, provider: str) -> bool:
    """Whether the provider's breaker holds every job back now: open with its pause still running, or half
    open with a probe out."""
    return bool(await conn.fetchval(
        "SELECT state <> 'closed' AND reopen_at > clock_timestamp() FROM provider_breakers WHERE provider = $1",
        provider))


async def breaker_gate(conn: asyncpg.Connection, provider: str, job_id: str) -> Admission:
    row = await conn.fetchrow(
        "SELECT state, reopen_at, probe_job_id FROM provider_breakers WHERE provider = $1", provider)
    if row is None or row["state"] == BreakerState.CLOSED:
        return GO
    now = datetime.now(UTC)
    if row["state"] == BreakerState.HALF_OPEN and row["probe_job_id"] == job_id:
        return Admission(probe=True)
    if row["reopen_at"] > now:
        wait = (row["reopen_at"] - now).total_seconds()
        if row["state"] == BreakerState.OPEN:
            return Admission(wait, f"{provider} is unavailable; submissions paused until "
                                   f"{row['reopen_at']:%H:%M:%S} UTC, then one job tests it", "breaker")
        return Admission(min(wait, 5.0), f"{provider} was unavailable; waiting for one test job to get through",
                         "breaker")
    # The pause is over (or the last probe never reported back): this job is the probe.
    await conn.execute(
        """
        UPDATE provider_breakers SET state = 'half_open', probe_job_id = $2,
            reopen_at = clock_timestamp() + make_interval(secs => 60)
        WHERE provider = $1
        """,
        provider, job_id,
    )
    return Admission(probe=True)


async def record_answer(
    conn: asyncpg.Connection, provider: str, code: ErrorCode | None, settings: Settings,
) -> BreakerState:
    """Feed the breaker with how the provider answered a submission (None: it accepted)."""
    if code not in (ErrorCode.PROVIDER_UNAVAILABLE, ErrorCode.TIMEOUT):
        # Any real answer, even a refusal of this one request, shows the provider is up.
        reopened = await conn.fetchval(
            """
            UPDATE provider_breakers b SET state = 'closed', failures = 0, probe_job_id = NULL, cooldown_s = 0
            FROM (SELECT state FROM provider_breakers WHERE provider = $1) AS was
            WHERE b.provider = $1 AND (b.state <> 'closed' OR b.failures <> 0)
            RETURNING was.state <> 'closed'
            """,
            provider,
        )
        if reopened:
            # The jobs it held back are parked: hand them the provider's free slots now.
            await outbox.add(conn, await waiting.slot_wakeup(conn, provider))
        return BreakerState.CLOSED
    row = await conn.fetchrow(
        """
        INSERT INTO provider_breakers AS b (provider, failures) VALUES ($1, 1)
        ON CONFLICT (provider) DO UPDATE SET failures = b.failures + 1
        RETURNING state, failures, cooldown_s
        """,
        provider,
    )
    probe_failed = row["state"] == BreakerState.HALF_OPEN
    if not probe_failed and row["failures"] < settings.breaker_threshold:
        return BreakerState(row["state"])
    cooldown = min(row["cooldown_s"] * 2 if probe_failed else settings.breaker_cooldown_s, MAX_COOLDOWN_S)
    await conn.execute(
        """
        UPDATE provider_breakers SET state = 'open', opened_at = clock_timestamp(), probe_job_id = NULL,
            reopen_at = clock_timestamp() + make_interval(secs => $2), cooldown_s = $2
        WHERE provider = $1
        """,
        provider, max(cooldown, settings.breaker_cooldown_s),
    )
    return BreakerState.OPEN

