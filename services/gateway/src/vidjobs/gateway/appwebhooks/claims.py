"""Which due deliveries are sent next, decided in one statement that every gateway replica runs in turn.

A tenant controls its endpoints: how many deliveries they draw, how slowly they answer, how many spellings
of one host they register. So what is in flight is kept in the rows (`claimed_until`), seen by every
replica, and a claim gives each account at most its share: `in_flight` attempts at once and `per_minute`
attempts a minute (the attempts of the last minute plus those under way); each host (`host:port`, whatever
the path or query) at most `host_in_flight` at once. Accounts take turns: each one's oldest due delivery
first, then each one's second, so one tenant's backlog never stands in front of another's first delivery;
and a host whose share is taken is passed over, so it never stands in front of the account's other hosts.
Deliveries over a cap are not dropped; they wait in their rows for a later claim.

Known gap: the host caps are applied after each account's share is read (its first due rows, up to its
room), so rows of a host short of its cap can fill that share and then be dropped for the host; while such a
host never fills, the account's other hosts wait out its backlog (tests/test_app_webhook_claims.py, xfail).
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common.settings import Settings

# `host:port` of a URL in SQL, lowercased, without userinfo: what the in-flight limit per host counts.
HOST_OF_URL = r"lower(substring({url} FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?([^/?#]+)'))"
_CLAIM_LOCK = "vidjobs:webhook-claims"


class Delivery(msgspec.Struct, kw_only=True):
    id: str
    account_id: str
    endpoint_id: str | None
    job_id: str
    event_type: str
    url: str
    attempts: int


class Caps(msgspec.Struct, frozen=True, kw_only=True):
    in_flight: int  # attempts of one account under way at once, across replicas
    per_minute: int  # attempts of one account a minute
    host_in_flight: int  # attempts to one host under way at once, whoever's

    @classmethod
    def of(cls, settings: Settings) -> Caps:
        return cls(in_flight=settings.webhook_deliveries_in_flight,
                   per_minute=settings.webhook_deliveries_per_minute,
                   host_in_flight=settings.webhook_host_in_flight)


# The accounts with waiting deliveries are walked through the (account_id, next_attempt_at) index one
# account at a time (a loose index scan), so a claim reads each account's first few rows, not the backlog.
_CLAIM = """
WITH RECURSIVE accounts AS (
    (SELECT account_id FROM webhook_deliveries WHERE status = 'pending' ORDER BY account_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.account_id FROM webhook_deliveries d
            WHERE d.status = 'pending' AND d.account_id > a.account_id ORDER BY d.account_id LIMIT 1)
    FROM accounts a WHERE a.account_id IS NOT NULL
),
busy AS (
    SELECT account_id, host FROM webhook_deliveries WHERE claimed_until > clock_timestamp() AND status = 'pending'
),
full_hosts AS (
    SELECT host FROM busy GROUP BY host HAVING count(*) >= $4
),
recent AS (
    SELECT account_id, count(*) AS n FROM webhook_attempts
    WHERE at > clock_timestamp() - interval '1 minute' GROUP BY account_id
),
room AS (
    SELECT a.account_id, LEAST($2 - b.n, $3 - b.n - COALESCE(r.n, 0)) AS n
    FROM accounts a
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM busy WHERE busy.account_id = a.account_id) b
    LEFT JOIN recent r ON r.account_id = a.account_id
    WHERE a.account_id IS NOT NULL
),
due AS (
    SELECT d.id, d.host, d.next_attempt_at, d.nth FROM room CROSS JOIN LATERAL (
        SELECT w.id, w.host, w.next_attempt_at, row_number() OVER (ORDER BY w.next_attempt_at, w.id) AS nth
        FROM webhook_deliveries w LEFT JOIN webhook_endpoints e ON e.id = w.endpoint_id
        WHERE w.account_id = room.account_id AND w.status = 'pending' AND w.next_attempt_at <= clock_timestamp()
          AND e.deleted_at IS NULL AND e.disabled_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM full_hosts f WHERE f.host IS NOT DISTINCT FROM w.host)
        ORDER BY w.next_attempt_at, w.id LIMIT GREATEST(room.n, 0)
    ) d
),
chosen AS (
    SELECT ranked.id FROM (
        SELECT due.*, row_number() OVER (PARTITION BY due.host ORDER BY due.nth, due.next_attempt_at) AS host_nth
        FROM due
    ) ranked
    WHERE ranked.host_nth <= $4 - (SELECT count(*) FROM busy WHERE busy.host IS NOT DISTINCT FROM ranked.host)
    ORDER BY ranked.nth, ranked.next_attempt_at LIMIT $1
)
UPDATE webhook_deliveries w SET claimed_until = clock_timestamp() + make_interval(secs => $5),
                                next_attempt_at = clock_timestamp() + make_interval(secs => $5),
                                updated_at = clock_timestamp()
FROM chosen WHERE w.id = chosen.id AND w.status = 'pending' AND w.next_attempt_at <= clock_timestamp()
RETURNING w.id, w.account_id, w.endpoint_id, w.job_id, w.event_type, w.url, w.attempts
"""


async def claim(pool: asyncpg.Pool, caps: Caps, limit: int, hold_s: float) -> list[Delivery]:
    """Up to `limit` deliveries to send now, each held for `hold_s` (it comes due again after that if its
    attempt never settles). Claims run one at a time across replicas, so each sees the others' in flight."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", _CLAIM_LOCK)
        rows = await conn.fetch(_CLAIM, limit, caps.in_flight, caps.per_minute, caps.host_in_flight, hold_s)
    return [msgspec.convert(dict(r), Delivery) for r in rows]
