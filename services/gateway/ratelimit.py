"""Requests per API key: a token bucket kept on the key's row, so every gateway replica shares it exactly.

One statement finds the key, locks its row, refills the bucket for the time since it was last touched, and
spends a token if a whole one is there. A request it refuses spends nothing: the bucket is only brought up
to date. Rate and burst are the account's own, or the platform's (`VIDJOBS_API_RATE_PER_S`,
`VIDJOBS_API_RATE_BURST`) where the account has none.
"""

from __future__ import annotations

import math

import asyncpg
import msgspec

from libs.common.settings import Settings
from services.gateway import accounts
from services.gateway.accounts import Account, hash_key

# The key row is locked in the first step, so a concurrent request for the same key waits there and then
# reads the bucket as the other one left it. `now()` is when the statement began, which may be before a
# request that waited on the lock committed: the bucket's clock only moves forward.
_ADMIT = f"""
WITH locked AS (
    SELECT k.id AS key_id, k.rate_tokens, k.rate_updated_at, {accounts.columns("a")},
           COALESCE(a.requests_per_s, $2::float8) AS rate, COALESCE(a.request_burst, $3::int)::float8 AS burst
    FROM api_keys k JOIN accounts a ON a.id = k.account_id
    WHERE k.key_hash = $1 AND k.revoked_at IS NULL
    FOR UPDATE OF k
),
bucket AS (
    SELECT locked.*, GREATEST(now(), COALESCE(rate_updated_at, now())) AS at,
           LEAST(burst, COALESCE(rate_tokens, burst)
                        + rate * GREATEST(0, EXTRACT(EPOCH FROM now() - rate_updated_at)::float8)) AS tokens
    FROM locked
)
UPDATE api_keys k
SET rate_tokens = CASE WHEN b.tokens >= 1 THEN b.tokens - 1 ELSE b.tokens END,
    rate_updated_at = b.at, last_used_at = b.at
FROM bucket b
WHERE k.id = b.key_id
RETURNING {accounts.columns("b")}, b.key_id::text AS key_id, b.rate, b.burst, b.tokens
"""


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    account: Account
    key_id: str
    admitted: bool
    rate_per_s: float  # in force for this key
    burst: int
    retry_after_s: int  # whole seconds until a token is there (0 when admitted)
    wait_s: float = 0.0  # exactly how long until a token is there


class Refusal(msgspec.Struct, frozen=True):
    until: float  # loop time before which the key's bucket holds no whole token
    rate_per_s: float
    burst: int


class Refusals:
    """Keys this process has just refused, until their bucket can hold a token again: a key hammering the API
    past its rate is answered 429 from memory, so its refusals cost no database write (and every other
    tenant's requests do not queue behind them). The database bucket stays the one authority: a refusal
    remembered here is one the database itself would give."""

    MAX_KEYS = 10_000

    def __init__(self) -> None:
        self._by_key: dict[bytes, Refusal] = {}

    def remember(self, key: str, admission: Admission, now: float) -> None:
        if len(self._by_key) >= self.MAX_KEYS:
            self._by_key = {k: r for k, r in self._by_key.items() if r.until > now}
        self._by_key[hash_key(key)] = Refusal(now + admission.wait_s, admission.rate_per_s, admission.burst)

    def current(self, key: str, now: float) -> Refusal | None:
        found = self._by_key.get(hash_key(key))
        if found is None or found.until <= now:
            return None
        return found


def limits_of(account: Account, settings: Settings) -> tuple[float, int]:
    """The account's request rate and burst, its own or the platform's."""
    rate = account.requests_per_s if account.requests_per_s is not None else settings.api_rate_per_s
    burst = account.request_burst if account.request_burst is not None else settings.api_rate_burst
    return rate, burst


def wait_s(tokens: float, rate_per_s: float) -> int:
    """Whole seconds until the bucket holds one token: rounded up, never 0 (`Retry-After: 0` invites a
    retry storm)."""
    return max(1, math.ceil((1.0 - tokens) / rate_per_s))


async def admit(conn: asyncpg.Connection | asyncpg.Pool, key: str, settings: Settings) -> Admission | None:
    """Authenticate `key` and spend one of its tokens; None for an unknown or revoked key."""
    row = await conn.fetchrow(_ADMIT, hash_key(key), settings.api_rate_per_s, settings.api_rate_burst)
    if row is None:
        return None
    admitted = row["tokens"] >= 1
    exact = 0.0 if admitted else (1.0 - row["tokens"]) / row["rate"]
    return Admission(account=accounts.account_of(row), key_id=row["key_id"], admitted=admitted, rate_per_s=row["rate"],
                     burst=int(row["burst"]), retry_after_s=0 if admitted else wait_s(row["tokens"], row["rate"]),
                     wait_s=exact)
