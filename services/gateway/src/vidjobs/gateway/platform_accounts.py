"""Everything a platform reads or changes about its accounts, bound to the platform: every query names the
platform, so another platform's account looks like none at all (as tenant.py binds an account's routes).

An account a platform makes is keyed by the platform's own id of its user (`external_id`): making it again
finds the one made first. Its limits are its own, or a copy of a named plan's, rewritten in the same
statement that changes the plan. Disabling cancels its waiting jobs (their credit is released by the
transition function, as any cancel's is) and, if asked, its running ones; deleting closes it the same way,
revokes its keys, and leaves the purge of its rows and objects to `purges.py`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from vidjobs.common import cancels, credits, db, ids
from vidjobs.common.credits import Entry
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import SQL_PENDING, SQL_TERMINAL
from vidjobs.gateway import accounts, audit, browsertokens
from vidjobs.gateway.accounts import Account

# Limits an account may hold of its own (each an `accounts` column), and those a plan carries.
ACCOUNT_LIMITS = ("concurrent_jobs", "max_queued_jobs", "daily_spend_cap", "max_job_credits", "requests_per_s",
                  "request_burst", "storage_quota_bytes", "fallback_models")
PLAN_LIMITS = ("concurrent_jobs", "max_queued_jobs", "daily_spend_cap", "max_job_credits", "fallback_models")


class PlatformAccount(msgspec.Struct, frozen=True, kw_only=True):
    account: Account
    created_at: datetime


class NoSuchPlan(Exception):
    def __init__(self, plan: str):
        super().__init__(f"plan: no plan {plan!r} on this platform; PUT /v1/platform/plans/{plan} makes it")


class ReservedCredit(Exception):
    """A take-back would leave less than the account has reserved for its running jobs."""


class IdempotencyReused(Exception):
    """An idempotency key used before for a different change."""


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    concurrent_jobs: int
    max_queued_jobs: int | None
    daily_spend_cap: int | None
    max_job_credits: int | None
    fallback_models: list[str]
    accounts: int
    updated_at: datetime


_ACCOUNT = f"SELECT {accounts.columns()}, created_at FROM accounts WHERE platform_id = $1 AND closed_at IS NULL"


def _platform_account(row: asyncpg.Record) -> PlatformAccount:
    return PlatformAccount(account=accounts.account_of(row), created_at=row["created_at"])


def _assignments(changes: dict[str, Any], start: int) -> tuple[str, list[Any]]:
    """`col = $n, ...` for columns named in ACCOUNT_LIMITS (or name/plan), never from input."""
    names = sorted(changes)
    if unknown := set(names) - {*ACCOUNT_LIMITS, "name", "plan"}:
        raise ValueError(f"not account fields: {', '.join(sorted(unknown))}")
    return ", ".join(f"{n} = ${i}" for i, n in enumerate(names, start)), [changes[n] for n in names]


class PlatformAccounts:
    """One gateway's access to every platform's accounts; each method names the platform it acts for."""

    def __init__(self, rt: Runtime):
        self._rt = rt

    async def account(self, platform_id: str, account_id: str) -> Account | None:
        row = await self._rt.pool.fetchrow(_ACCOUNT + " AND id = $2", platform_id, account_id)
        return None if row is None else accounts.account_of(row)

    async def get(self, platform_id: str, account_id: str, conn: Any = None) -> PlatformAccount | None:
        row = await (conn or self._rt.pool).fetchrow(_ACCOUNT + " AND id = $2", platform_id, account_id)
        return None if row is None else _platform_account(row)

    async def create(self, platform_id: str, external_id: str, name: str, plan: str | None,
                     limits: dict[str, Any]) -> tuple[PlatformAccount, bool]:
        """The account of `external_id`, made now (True) or found as an earlier call made it (False)."""
        async with self._rt.pool.acquire() as conn, conn.transaction():
            found = await conn.fetchrow(_ACCOUNT + " AND external_id = $2", platform_id, external_id)
            if found is not None:
                return _platform_account(found), False
            values = await self._plan_limits(db.lent(conn), platform_id, plan) if plan is not None else {}
            values.update(limits)
            values.update(name=name or external_id, plan=plan)
            names = sorted(values)
            account_id = ids.new("acct")
            row = await conn.fetchrow(
                f"INSERT INTO accounts (id, platform_id, external_id, {', '.join(names)}) "
                f"VALUES ($1, $2, $3, {', '.join(f'${i}' for i in range(4, 4 + len(names)))}) "
                f"ON CONFLICT (platform_id, external_id) WHERE external_id IS NOT NULL DO NOTHING "
                f"RETURNING {accounts.columns()}, created_at",
                account_id, platform_id, external_id, *(values[n] for n in names))
            if row is None:  # a racing call with the same external_id made it first
                row = await conn.fetchrow(_ACCOUNT + " AND external_id = $2", platform_id, external_id)
                assert row is not None, "the conflicting row is there once the insert has waited for it"
                return _platform_account(row), False
            return _platform_account(row), True

    async def _plan_limits(self, conn: asyncpg.Connection, platform_id: str, plan: str) -> dict[str, Any]:
        row = await conn.fetchrow(f"SELECT {', '.join(PLAN_LIMITS)} FROM plans WHERE platform_id = $1 AND name = $2",
                                  platform_id, plan)
        if row is None:
            raise NoSuchPlan(plan)
        return dict(row)

    async def page(self, platform_id: str, external_id: str | None, after: tuple[datetime, str] | None,
                   limit: int) -> list[PlatformAccount]:
        rows = await self._rt.pool.fetch(
            _ACCOUNT + " AND ($2::text IS NULL OR external_id = $2)"
            " AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4)) ORDER BY created_at, id LIMIT $5",
            platform_id, external_id, after[0] if after else None, after[1] if after else None, limit)
        return [_platform_account(r) for r in rows]

    async def update(self, platform_id: str, account_id: str, changes: dict[str, Any],
                     plan: str | None = None) -> PlatformAccount | None:
        """Set `changes` (limits, name); with `plan`, its limits first and the plan named. A limit given
        without a plan takes the account off its plan."""
        async with self._rt.pool.acquire() as conn, conn.transaction():
            values: dict[str, Any] = {}
            if plan is not None:
                values.update(await self._plan_limits(db.lent(conn), platform_id, plan), plan=plan)
            elif set(changes) & set(ACCOUNT_LIMITS):
                values["plan"] = None
            values.update(changes)
            if not values:
                return await self.get(platform_id, account_id, conn)
            assignments, args = _assignments(values, 3)
            row = await conn.fetchrow(
                f"UPDATE accounts SET {assignments} WHERE platform_id = $1 AND id = $2 AND closed_at IS NULL "
                f"RETURNING {accounts.columns()}, created_at", platform_id, account_id, *args)
            return None if row is None else _platform_account(row)

    async def set_disabled(self, platform_id: str, account_id: str, disabled: bool, *, stop_running: bool = False,
                           reason: str = "") -> tuple[PlatformAccount, list[str]] | None:
        """Disable (cancel its waiting jobs, and its running ones with `stop_running`) or enable the account."""
        row = await self._rt.pool.fetchrow(
            "UPDATE accounts SET disabled_at = CASE WHEN $3 THEN COALESCE(disabled_at, now()) END "
            "WHERE platform_id = $1 AND id = $2 AND closed_at IS NULL RETURNING id",
            platform_id, account_id, disabled)
        if row is None:
            return None
        canceled = await self.cancel_jobs(account_id, waiting_only=not stop_running,
                                          reason=f"account disabled by its platform{': ' if reason else ''}{reason}")
        found = await self.get(platform_id, account_id)
        assert found is not None
        return found, canceled if disabled else []

    async def cancel_jobs(self, account_id: str, *, waiting_only: bool, reason: str) -> list[str]:
        """Cancel the account's live (or only its waiting) jobs, each in its own transaction: a job that moved on
        meanwhile is left as it ended."""
        which = f"status = {SQL_PENDING}" if waiting_only else f"status NOT IN {SQL_TERMINAL}"
        rows = await self._rt.pool.fetch(
            f"SELECT id FROM jobs WHERE account_id = $1 AND deleted_at IS NULL AND {which} ORDER BY created_at",
            account_id)
        canceled = []
        for row in rows:
            async with self._rt.tx() as conn:
                if await cancels.cancel(conn, row["id"], reason=reason) is not None:
                    canceled.append(row["id"])
        return canceled

    async def close(self, platform_id: str, account_id: str) -> tuple[int, list[str]] | None:
        """Close the account for deletion: it stops being the platform's to see, its keys are revoked (its
        tokens die with them), its live jobs are canceled. Returns (keys revoked, jobs canceled)."""
        async with self._rt.pool.acquire() as conn, conn.transaction():
            closed = await conn.fetchval(
                "UPDATE accounts SET closed_at = now(), disabled_at = COALESCE(disabled_at, now()) "
                "WHERE platform_id = $1 AND id = $2 AND closed_at IS NULL RETURNING id", platform_id, account_id)
            if closed is None:
                return None
            revoked = await conn.fetch(
                "UPDATE api_keys SET revoked_at = now() WHERE account_id = $1 AND revoked_at IS NULL RETURNING id",
                account_id)
        canceled = await self.cancel_jobs(account_id, waiting_only=False, reason="account deleted by its platform")
        return len(revoked), canceled

    # --- credit -------------------------------------------------------------------------------------------
    async def credit(self, platform_key: str, account_id: str, amount: int, idempotency_key: str, note: str,
                     request_id: str) -> tuple[Entry, bool] | None:
        """Grant (or, negative, take back) credit through platform_credit, which checks the key itself. Returns
        (the ledger entry, whether an earlier call made it); None if the platform has no such account."""
        try:
            row = await self._rt.pool.fetchrow("SELECT * FROM platform_credit($1, $2, $3, $4, $5, $6)",
                                               platform_key, account_id, amount, idempotency_key, note, request_id)
        except asyncpg.CheckViolationError as exc:
            raise ReservedCredit(str(exc)) from exc
        except asyncpg.UniqueViolationError as exc:
            raise IdempotencyReused(exc.message) from exc
        if row is None or row["entry_id"] is None:
            return None
        entry = await self._rt.pool.fetchrow("SELECT * FROM credit_ledger WHERE id = $1", row["entry_id"])
        assert entry is not None, "a ledger entry is never removed but with its account"
        return msgspec.convert(dict(entry), Entry), row["replayed"]

    async def ledger(self, account_id: str, *, before_id: int | None, limit: int) -> list[Entry]:
        return await credits.entries(self._rt.pool, account_id, before_id=before_id, limit=limit)

    # --- plans ----------------------------------------------------------------------------------------------
    async def put_plan(self, platform_id: str, name: str, limits: dict[str, Any]) -> Plan:
        """Make or change a plan; every account on it takes its limits in the same transaction."""
        names = list(PLAN_LIMITS)
        async with self._rt.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"INSERT INTO plans (platform_id, name, {', '.join(names)}) "
                f"VALUES ($1, $2, {', '.join(f'${i}' for i in range(3, 3 + len(names)))}) "
                f"ON CONFLICT (platform_id, name) DO UPDATE SET "
                f"{', '.join(f'{n} = EXCLUDED.{n}' for n in names)}, updated_at = now()",
                platform_id, name, *(limits[n] for n in names))
            await conn.execute(
                f"UPDATE accounts a SET {', '.join(f'{n} = p.{n}' for n in names)} FROM plans p "
                "WHERE p.platform_id = $1 AND p.name = $2 AND a.platform_id = $1 AND a.plan = $2", platform_id, name)
        plans = await self.plans(platform_id, name)
        return plans[0]

    async def plans(self, platform_id: str, name: str | None = None) -> list[Plan]:
        rows = await self._rt.pool.fetch(
            f"""
            SELECT p.name, {', '.join(f'p.{n}' for n in PLAN_LIMITS)}, p.updated_at,
                   (SELECT count(*) FROM accounts a WHERE a.platform_id = p.platform_id AND a.plan = p.name
                      AND a.closed_at IS NULL) AS accounts
            FROM plans p WHERE p.platform_id = $1 AND ($2::text IS NULL OR p.name = $2) ORDER BY p.name
            """, platform_id, name)
        return [msgspec.convert(dict(r), Plan) for r in rows]

    # --- keys -------------------------------------------------------------------------------------------------
    async def create_key(self, account_id: str, name: str) -> tuple[accounts.KeyInfo, str]:
        key_id, key = await accounts.create_key(self._rt.pool, account_id, name)
        listed = await accounts.list_keys(self._rt.pool, account_id)
        return next(k for k in listed if k.id == key_id), key

    async def keys(self, account_id: str) -> list[accounts.KeyInfo]:
        return await accounts.list_keys(self._rt.pool, account_id)

    async def revoke_key(self, account_id: str, key_id: str) -> bool:
        """Revoke the account's key; False if it has no such key (revoking twice is no error)."""
        found = await self._rt.pool.fetchval(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 AND account_id = $2 "
            "RETURNING id", key_id, account_id)
        return found is not None

    async def owned_jobs(self, account_id: str, job_ids: list[str]) -> set[str]:
        """Which of `job_ids` are live (not deleted) jobs of the account."""
        rows = await self._rt.pool.fetch(
            "SELECT id FROM jobs WHERE account_id = $1 AND id = ANY($2::text[]) AND deleted_at IS NULL",
            account_id, job_ids)
        return {r["id"] for r in rows}

    async def audit_trail(self, platform_id: str, *, account_id: str | None, before_id: int | None,
                          limit: int) -> list[audit.Line]:
        return await audit.trail(self._rt.pool, platform_id, account_id=account_id, before_id=before_id, limit=limit)

    async def mint_token(self, account_id: str, grant: browsertokens.Grant, *, issuer_kind: str,
                         issuer_key_id: str) -> tuple[str, str, datetime]:
        """A browser token for the account (browsertokens.mint): (token id, token, expires at)."""
        return await browsertokens.mint(self._rt.pool, self._rt.settings, account_id, grant,
                                        issuer_kind=issuer_kind, issuer_key_id=issuer_key_id)

    async def token_credits_used(self, token_id: str) -> int:
        """What the creates of a browser token have reserved so far."""
        used = await self._rt.pool.fetchval("SELECT credits_used FROM browser_tokens WHERE id = $1", token_id)
        return int(used or 0)
