"""Requests per API key: a token bucket per key, kept in each gateway's memory and shared through the key's
row, so a request costs no database write.

A key is looked up once (one read: the key, its account, and the bucket as the row last left it) and kept
for `KEY_CACHE_S`; a request then spends a token from the local bucket. Every `SYNC_S` one statement
writes what each key spent here into its row, refilled for the time since, and the row's level comes back:
what every replica spent is then in every replica's bucket. Between two syncs each replica spends from the
level it last saw, so N replicas can together admit up to N times what was left for one interval; the
row's level then goes below zero, and every replica refuses the key until that debt has refilled. Rate and
burst are the account's own, or the platform's (`VIDJOBS_API_RATE_PER_S`, `VIDJOBS_API_RATE_BURST`). A
revoked key in use is dropped at the next sync (within `SYNC_S`); an idle one is read again at its next use
after `KEY_CACHE_S`, which is also how soon an account's changed limits apply.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import msgspec

from vidjobs.common.settings import Settings
from vidjobs.gateway import accounts
from vidjobs.gateway.accounts import Account, hash_key

KEY_CACHE_S = 5.0  # a key's account and limits are reread this often
SYNC_S = 0.5  # how often the spending here is written to the keys' rows
IDLE_S = 60.0  # a key unused this long leaves memory

# The key, its account, and its bucket refilled for the time since the row was last written. A read.
_LOAD = f"""
SELECT k.id::text AS key_id, {accounts.columns("a")},
       COALESCE(a.requests_per_s, $2::float8) AS rate, COALESCE(a.request_burst, $3::int)::float8 AS burst,
       LEAST(COALESCE(a.request_burst, $3::int)::float8,
             COALESCE(k.rate_tokens, COALESCE(a.request_burst, $3::int)::float8)
             + COALESCE(a.requests_per_s, $2::float8)
               * GREATEST(0, EXTRACT(EPOCH FROM now() - COALESCE(k.rate_updated_at, now()))::float8)) AS tokens
FROM api_keys k JOIN accounts a ON a.id = k.account_id
WHERE k.key_hash = $1 AND k.revoked_at IS NULL
"""

# What each key spent here since the last sync, taken from its row's bucket refilled for the time since it
# was written; the row's new level comes back. The bucket is capped after the spending is taken, as if the
# requests had come early in the interval: capping first would lose the refill of every interval in which
# the bucket was full, and refuse a steady client below its rate. `now()` may be earlier than another
# replica's write that this one waited for: the bucket's clock only moves forward. A row never written yet
# was full when this replica read it (`seen_at`).
_SYNC = """
UPDATE api_keys k
SET rate_tokens = LEAST(COALESCE(a.request_burst, $4::int)::float8,
                        COALESCE(k.rate_tokens, COALESCE(a.request_burst, $4::int)::float8)
                        + COALESCE(a.requests_per_s, $3::float8)
                          * GREATEST(0, EXTRACT(EPOCH FROM now() - COALESCE(k.rate_updated_at, s.seen_at))::float8)
                        - s.spent),
    rate_updated_at = GREATEST(now(), COALESCE(k.rate_updated_at, now())),
    last_used_at = GREATEST(now(), COALESCE(k.last_used_at, now()))
FROM unnest($1::bytea[], $2::int[], $5::timestamptz[]) AS s(key_hash, spent, seen_at), accounts a
WHERE k.key_hash = s.key_hash AND a.id = k.account_id
RETURNING k.key_hash, k.rate_tokens, k.revoked_at IS NOT NULL AS revoked
"""


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    account: Account
    key_id: str
    admitted: bool
    rate_per_s: float  # in force for this key
    burst: int
    retry_after_s: int  # whole seconds until a token is there (0 when admitted)
    remaining: int = 0  # whole tokens left after this request
    full_in_s: int = 0  # whole seconds until the bucket is full again


def limits_of(account: Account, settings: Settings) -> tuple[float, int]:
    """The account's request rate and burst, its own or the platform's."""
    rate = account.requests_per_s if account.requests_per_s is not None else settings.api_rate_per_s
    burst = account.request_burst if account.request_burst is not None else settings.api_rate_burst
    return rate, burst


def wait_s(tokens: float, rate_per_s: float) -> int:
    """Whole seconds until the bucket holds one token: rounded up, never 0 (`Retry-After: 0` invites a
    retry storm)."""
    return max(1, math.ceil((1.0 - tokens) / rate_per_s))


@dataclass
class _Key:
    account: Account
    key_id: str
    rate: float
    burst: float
    tokens: float
    at: float  # when `tokens` was true (loop time)
    loaded_at: float
    seen_at: datetime  # when the row was read (wall clock), for a row never written yet
    spent: int = 0  # admitted here since the last sync

    def refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now


class Buckets:
    """Every key this gateway has seen recently, with its bucket."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings, clock: Callable[[], float] | None = None):
        self._pool = pool
        self._settings = settings
        self._clock = clock or asyncio.get_running_loop().time
        self._keys: dict[bytes, _Key] = {}
        self._loading: dict[bytes, asyncio.Future[_Key | None]] = {}

    async def admit(self, key: str) -> Admission | None:
        """Authenticate `key` and spend one of its tokens; None for an unknown or revoked key."""
        digest = hash_key(key)
        entry = await self._entry(digest)
        if entry is None:
            return None
        entry.refill(self._clock())
        admitted = entry.tokens >= 1
        if admitted:
            entry.tokens -= 1
            entry.spent += 1
        return Admission(account=entry.account, key_id=entry.key_id, admitted=admitted, rate_per_s=entry.rate,
                         burst=int(entry.burst), retry_after_s=0 if admitted else wait_s(entry.tokens, entry.rate),
                         remaining=max(0, math.floor(entry.tokens)),
                         full_in_s=math.ceil(max(0.0, entry.burst - entry.tokens) / entry.rate))

    async def _entry(self, digest: bytes) -> _Key | None:
        entry = self._keys.get(digest)
        if entry is not None and self._clock() - entry.loaded_at < KEY_CACHE_S:
            return entry
        # Requests racing for a key not in memory share one read.
        if (loading := self._loading.get(digest)) is not None:
            return await loading
        future: asyncio.Future[_Key | None] = asyncio.get_running_loop().create_future()
        self._loading[digest] = future
        try:
            fresh = await self._load(digest, entry)
            future.set_result(fresh)
            return fresh
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters (if any) see it, nobody is warned about it
            raise
        finally:
            del self._loading[digest]

    async def _load(self, digest: bytes, previous: _Key | None) -> _Key | None:
        row = await self._pool.fetchrow(_LOAD, digest, self._settings.api_rate_per_s, self._settings.api_rate_burst)
        if row is None:
            self._keys.pop(digest, None)
            return None
        now = self._clock()
        spent = previous.spent if previous is not None else 0  # not yet in the row: still owed
        entry = _Key(account=accounts.account_of(row), key_id=row["key_id"], rate=row["rate"], burst=row["burst"],
                     tokens=row["tokens"] - spent, at=now, loaded_at=now, seen_at=datetime.now(UTC), spent=spent)
        self._keys[digest] = entry
        return entry

    async def sync(self) -> None:
        """Write what each key spent here into its row and take the shared level back; forget idle keys."""
        now = self._clock()
        for digest in [d for d, e in self._keys.items() if e.spent == 0 and now - e.at > IDLE_S]:
            del self._keys[digest]
        spending = {d: e.spent for d, e in self._keys.items() if e.spent}
        if not spending:
            return
        rows = await self._pool.fetch(_SYNC, list(spending), list(spending.values()),
                                      self._settings.api_rate_per_s, self._settings.api_rate_burst,
                                      [self._keys[d].seen_at for d in spending])
        now = self._clock()
        for row in rows:
            entry = self._keys.get(row["key_hash"])
            if entry is None:
                continue
            if row["revoked"]:
                del self._keys[row["key_hash"]]  # its next request reads the row again, and is refused
                continue
            entry.spent -= spending[row["key_hash"]]  # what was admitted while the statement ran stays owed
            entry.tokens, entry.at = row["rate_tokens"] - entry.spent, now
