"""Browser tokens (`vjt_…`): what a person's browser holds to watch (and perhaps start) their own jobs.

A token is minted by the account (`POST /v1/account/tokens`) or by its platform, for minutes (at most an
hour), and is `vjt_<key id>.<claims>.<signature>`: the claims (the grant's id, the account, the expiry) are
signed with a key derived from VIDJOBS_SECRETS_KEY, so a forged or expired token is refused without a read.
The grant itself is a `browser_tokens` row: its scopes (`read`: read and stream jobs, `create`: create jobs,
`upload`: upload input images), the jobs it is limited to (or all of the account's), a credit ceiling on what
its creates may reserve together, and its issuer. A token dies at its expiry, and within `CACHE_S` when its
issuer's key is revoked or the account is closed.

It is sent as `Authorization: Bearer vjt_…`, or, since EventSource cannot send a header, as the
`access_token` query parameter of a GET (never written to a log: the access log holds the path only).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hashlib
import hmac
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from vidjobs.common import ids
from vidjobs.common.settings import Settings
from vidjobs.gateway import accounts, sealing
from vidjobs.gateway.accounts import Account

PREFIX = "vjt_"
MAX_CHARS = 512  # longer is not one of ours, refused before anything is decoded
MAX_TTL_S = 3600
MIN_TTL_S = 60
MAX_JOBS = 100  # jobs one token may name
CACHE_S = 5.0
_PURPOSE = b"browser tokens"


class TokenScope(enum.StrEnum):
    READ = "read"
    CREATE = "create"
    UPLOAD = "upload"


class Claims(msgspec.Struct, array_like=True, frozen=True):
    token_id: str
    account_id: str
    expires: int  # seconds since 1970, UTC


class BrowserToken(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    account: Account
    scopes: frozenset[TokenScope]
    job_ids: frozenset[str] | None  # None: every job of the account
    credit_ceiling: int | None
    expires_at: datetime
    issuer_key_id: str

    def may_see(self, job_id: str) -> bool:
        return self.job_ids is None or job_id in self.job_ids


class Refused(Exception):
    """Not a token this gateway accepts; the message says why, for the 401."""


def is_token(text: str) -> bool:
    return text.startswith(PREFIX)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


def _signature(key: bytes, kid: str, claims: str) -> str:
    return _b64(hmac.new(key, f"{PREFIX}{kid}.{claims}".encode(), hashlib.sha256).digest())


def sign(settings: Settings, claims: Claims) -> str:
    kid, key = sealing.subkeys(settings, _PURPOSE)[0]
    body = _b64(msgspec.json.encode(claims))
    return f"{PREFIX}{kid}.{body}.{_signature(key, kid, body)}"


def verify(settings: Settings, token: str, now: datetime | None = None) -> Claims:
    """The claims of a token we signed that has not expired; Refused otherwise."""
    if len(token) > MAX_CHARS or not token.isascii():
        raise Refused("not a browser token")
    kid, _, rest = token.removeprefix(PREFIX).partition(".")
    body, _, signature = rest.partition(".")
    key = dict(sealing.subkeys(settings, _PURPOSE)).get(kid)
    if key is None or not hmac.compare_digest(signature, _signature(key, kid, body)):
        raise Refused("not a browser token this service signed (or signed under a key it no longer holds)")
    try:
        claims = msgspec.json.decode(_unb64(body), type=Claims)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise Refused("not a browser token") from None
    if claims.expires <= (now or datetime.now(UTC)).timestamp():
        raise Refused("this browser token has expired; ask the app for a new one")
    return claims


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """What a new token may do, as its minter asked."""

    scopes: list[TokenScope]
    job_ids: list[str] | None
    credit_ceiling: int | None
    ttl_s: int


async def mint(conn: asyncpg.Connection | asyncpg.Pool, settings: Settings, account_id: str, grant: Grant, *,
               issuer_kind: str, issuer_key_id: str) -> tuple[str, str, datetime]:
    """Record the grant and sign its token; returns (token id, token, expires at)."""
    token_id = ids.new("tok")
    expires_at = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=grant.ttl_s)
    await conn.execute(
        "INSERT INTO browser_tokens (id, account_id, issuer_kind, issuer_key_id, scopes, job_ids, credit_ceiling, "
        "expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        token_id, account_id, issuer_kind, issuer_key_id, [s.value for s in grant.scopes], grant.job_ids,
        grant.credit_ceiling, expires_at)
    return token_id, sign(settings, Claims(token_id, account_id, int(expires_at.timestamp()))), expires_at


_LOAD = f"""
SELECT t.id AS token_id, t.scopes, t.job_ids, t.credit_ceiling, t.expires_at, t.issuer_key_id, {accounts.columns("a")}
FROM browser_tokens t JOIN accounts a ON a.id = t.account_id
WHERE t.id = $1 AND t.account_id = $2 AND a.closed_at IS NULL AND t.expires_at > now()
  AND CASE t.issuer_kind
        WHEN 'api_key' THEN EXISTS (SELECT 1 FROM api_keys k
                                    WHERE k.id = t.issuer_key_id AND k.account_id = t.account_id
                                      AND k.revoked_at IS NULL)
        ELSE EXISTS (SELECT 1 FROM platform_keys k
                     WHERE k.id = t.issuer_key_id AND k.platform_id = a.platform_id AND k.revoked_at IS NULL
                       AND (k.expires_at IS NULL OR k.expires_at > now()))
      END
"""


class Tokens:
    """The grants of tokens this gateway has seen recently, each reread after `CACHE_S`."""

    def __init__(self, pool: asyncpg.Pool, clock: Callable[[], float] | None = None):
        self._pool = pool
        self._clock = clock or asyncio.get_running_loop().time
        self._grants: dict[str, tuple[BrowserToken | None, float]] = {}

    async def find(self, claims: Claims, *, fresh: bool = False) -> BrowserToken | None:
        """The live grant behind verified `claims`; None once revoked (its issuer's key), expired or closed.
        `fresh` rereads it (a job made through the token on another gateway is in its row, not in memory)."""
        cached = self._grants.get(claims.token_id)
        if cached is not None and not fresh and self._clock() - cached[1] < CACHE_S:
            return cached[0]
        row = await self._pool.fetchrow(_LOAD, claims.token_id, claims.account_id)
        found = None if row is None else BrowserToken(
            id=row["token_id"], account=accounts.account_of(row), scopes=frozenset(map(TokenScope, row["scopes"])),
            job_ids=None if row["job_ids"] is None else frozenset(row["job_ids"]),
            credit_ceiling=row["credit_ceiling"], expires_at=row["expires_at"], issuer_key_id=row["issuer_key_id"])
        if len(self._grants) > 50_000:
            self._grants = {k: v for k, v in self._grants.items() if self._clock() - v[1] < CACHE_S}
        self._grants[claims.token_id] = (found, self._clock())
        return found

    def forget(self, token_id: str) -> None:
        self._grants.pop(token_id, None)


class OverCeiling(Exception):
    """A create through a token would take its creates past the token's credit ceiling."""

    def __init__(self, ceiling: int, used: int, wanted: int):
        super().__init__(f"this browser token may reserve {ceiling} credits in all; {used} are taken and this job "
                         f"is estimated at {wanted}")


async def spend(conn: asyncpg.Connection, token_id: str, credits: int, job_id: str) -> None:
    """Count a job created through the token against its ceiling, and let the token see it (in the create's
    transaction). Raises OverCeiling, and the create rolls back."""
    row = await conn.fetchrow(
        """
        UPDATE browser_tokens SET credits_used = credits_used + $2,
               job_ids = CASE WHEN job_ids IS NULL THEN NULL ELSE array_append(job_ids, $3) END
        WHERE id = $1 RETURNING credits_used, credit_ceiling
        """, token_id, credits, job_id)
    if row is not None and row["credit_ceiling"] is not None and row["credits_used"] > row["credit_ceiling"]:
        raise OverCeiling(row["credit_ceiling"], row["credits_used"] - credits, credits)
