"""Which due deliveries are sent next, decided in one statement that every gateway replica runs in turn.

A tenant controls its endpoints: how many deliveries they draw, how slowly they answer, how many spellings
of one host they register. So what is in flight is kept in the rows (`claimed_until`), seen by every
replica, and a claim gives each account at most its share: `in_flight` attempts at once and `per_minute`
attempts a minute (the attempts of the last minute plus those under way); each host (`host:port`, whatever
the path or query) at most `host_in_flight` at once. Accounts take turns: each one's oldest due delivery
first, then each one's second, so one tenant's backlog never stands in front of another's first delivery;
and a host whose share is taken is passed over, so it never stands in front of the account's other hosts:
an account's share is filled with the rows its hosts still have room for, so a host with a backlog, full or
not, gives the account at most its room left and the account's other hosts fill the rest. Deliveries over
a cap are not dropped; they wait in their rows for a later claim. How the statement reads an account's rows
without reading its backlog is told beside it (`_CLAIM`).
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


# A delivery whose endpoint was deleted or disabled is never claimed. Tested row by row as each index is read
# (a subquery under OR stays a filter, never a join the planner may place above the LIMIT): a read stops at
# the rows it needs.
_LIVE_ENDPOINT = ("(w.endpoint_id IS NULL OR NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = w.endpoint_id"
                  " AND (e.deleted_at IS NOT NULL OR e.disabled_at IS NOT NULL)))")

# The accounts with waiting deliveries are walked through the (account_id, next_attempt_at) index one
# account at a time (a loose index scan), so a claim reads each account's first few rows, not the backlog.
#
# An account's share is filled oldest first with rows each host still has room for: a row of a host is
# taken only while the host has fewer of the account's rows taken than places left (`host_room`), so a host
# with a backlog gives up its room and no more, and the account's other hosts come next. The share is read
# in one of two ways, both bounded:
#   head     the account's first 2 x room due rows, by due time (the index above). When they hold a whole
#            share within the hosts' room, that share is the same as reading the whole backlog would give
#            (every row before its last pick was seen), at the cost of a few rows more than the share. Twice
#            the room because an account spread over a few hosts fills its share well within that, while
#            an account whose first rows are mostly one host's backlog gains nothing from reading further by
#            time: its other hosts' rows may be any number of rows behind.
#   by host  only for an account whose head was cut short at 2 x room and still holds less than a share
#            (`deep`: more than half of it is the overflow of hosts whose room is taken): its hosts are
#            walked through the (account_id, host, next_attempt_at, id) index (another loose index scan),
#            and each host's first due rows, up to the lesser of its room and the account's, are read in
#            that index's order. That is one probe per host the account has pending deliveries to, and a few
#            rows per host: never more than the account's pending rows, and, for the usual account with a
#            few endpoints, a few rows however deep one host's backlog. An account with pending deliveries
#            to many hosts (a job's own webhook_url may name any) costs a probe for each, but only while its
#            first rows are a backlog; otherwise its head alone is read.
# Accounts take turns in `chosen`, where the hosts' room is held across accounts (a row an account's share
# gave a host may still lose that place to another account's earlier turn, and waits for the next claim).
_CLAIM = f"""
WITH RECURSIVE accounts AS (
    (SELECT account_id FROM webhook_deliveries WHERE status = 'pending' ORDER BY account_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.account_id FROM webhook_deliveries d
            WHERE d.status = 'pending' AND d.account_id > a.account_id ORDER BY d.account_id LIMIT 1)
    FROM accounts a WHERE a.account_id IS NOT NULL
),
clock AS (  -- one "now" for the reads below, which an index can range over (clock_timestamp() is volatile)
    SELECT clock_timestamp() AS now
),
busy AS (
    SELECT account_id, host FROM webhook_deliveries WHERE claimed_until > clock_timestamp() AND status = 'pending'
),
host_room AS (  -- hosts with attempts under way, and the places each has left ('' stands for no host)
    SELECT COALESCE(host, '') AS host, $4 - count(*) AS n FROM busy GROUP BY 1
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
head AS (
    SELECT room.account_id, room.n AS room, h.id, h.host, h.next_attempt_at,
           row_number() OVER (PARTITION BY room.account_id, h.host ORDER BY h.next_attempt_at, h.id)
               <= COALESCE(hr.n, $4) AS fits
    FROM room CROSS JOIN LATERAL (
        SELECT w.id, w.host, w.next_attempt_at
        FROM webhook_deliveries w
        WHERE w.account_id = room.account_id AND w.status = 'pending' AND w.next_attempt_at <= (SELECT now FROM clock)
          AND {_LIVE_ENDPOINT}
        ORDER BY w.next_attempt_at, w.id LIMIT GREATEST(2 * room.n, 0)
    ) h
    LEFT JOIN host_room hr ON hr.host = COALESCE(h.host, '')
    WHERE room.n > 0
),
deep AS (
    SELECT account_id, room FROM head GROUP BY account_id, room
    HAVING count(*) = 2 * room AND count(*) FILTER (WHERE fits) < room
),
by_host AS (
    SELECT deep.account_id, p.id, p.host, p.next_attempt_at FROM deep CROSS JOIN LATERAL (
        WITH RECURSIVE hosts AS (
            (SELECT w.host FROM webhook_deliveries w
             WHERE w.account_id = deep.account_id AND w.status = 'pending' AND w.host IS NOT NULL
             ORDER BY w.host LIMIT 1)
            UNION ALL
            SELECT (SELECT w.host FROM webhook_deliveries w
                    WHERE w.account_id = deep.account_id AND w.status = 'pending' AND w.host > hosts.host
                    ORDER BY w.host LIMIT 1)
            FROM hosts WHERE hosts.host IS NOT NULL
        )
        SELECT d.id, d.host, d.next_attempt_at
        FROM hosts LEFT JOIN host_room hr ON hr.host = hosts.host
        CROSS JOIN LATERAL (
            SELECT w.id, w.host, w.next_attempt_at
            FROM webhook_deliveries w
            WHERE w.account_id = deep.account_id AND w.status = 'pending' AND w.host = hosts.host
              AND w.next_attempt_at <= (SELECT now FROM clock) AND {_LIVE_ENDPOINT}
            ORDER BY w.next_attempt_at, w.id LIMIT GREATEST(LEAST(COALESCE(hr.n, $4), deep.room), 0)
        ) d
        WHERE hosts.host IS NOT NULL
        UNION ALL  -- deliveries made before hosts were recorded: one host of their own, as in host_room
        (SELECT w.id, w.host, w.next_attempt_at
         FROM webhook_deliveries w
         WHERE w.account_id = deep.account_id AND w.status = 'pending' AND w.host IS NULL
           AND w.next_attempt_at <= (SELECT now FROM clock) AND {_LIVE_ENDPOINT}
         ORDER BY w.next_attempt_at, w.id
         LIMIT GREATEST(LEAST(COALESCE((SELECT n FROM host_room WHERE host = ''), $4), deep.room), 0))
    ) p
),
due AS (
    SELECT ranked.id, ranked.host, ranked.next_attempt_at, ranked.nth FROM (
        SELECT c.account_id, c.id, c.host, c.next_attempt_at,
               row_number() OVER (PARTITION BY c.account_id ORDER BY c.next_attempt_at, c.id) AS nth
        FROM (SELECT account_id, id, host, next_attempt_at FROM head
              WHERE fits AND NOT EXISTS (SELECT 1 FROM deep WHERE deep.account_id = head.account_id)
              UNION ALL
              SELECT account_id, id, host, next_attempt_at FROM by_host) c
    ) ranked JOIN room ON room.account_id = ranked.account_id
    WHERE ranked.nth <= room.n
),
chosen AS (
    SELECT ranked.id FROM (
        SELECT due.*, row_number() OVER (PARTITION BY due.host ORDER BY due.nth, due.next_attempt_at) AS host_nth
        FROM due
    ) ranked LEFT JOIN host_room hr ON hr.host = COALESCE(ranked.host, '')
    WHERE ranked.host_nth <= COALESCE(hr.n, $4)
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
