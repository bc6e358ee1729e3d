"""Operator commands on the database: accounts, API keys, platform keys, credits, the submission switch and the
rate card.

Each command is a coroutine taking an open connection; `cli/__main__.py` parses the arguments and hands it
to `run`. What a command exists to show (a key, a table, a number) goes to stdout, so it can be piped;
notes for the person at the terminal go to stderr.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from vidjobs.cli import closing, platforms, spending
from vidjobs.cli.exitcodes import BackendUnreachable, NotFound, Refused, SchemaAhead, SchemaBehind
from vidjobs.common import credits, db, grants, ratecard, switch
from vidjobs.common.errors import ConfigError, StoreError
from vidjobs.common.settings import Settings
from vidjobs.gateway import accounts, audit, platformkeys
from vidjobs.storage.base import Storage, account_prefix
from vidjobs.storage.factory import open_storage

Command = Callable[[asyncpg.Connection], Awaitable[None]]


def run(database_url: str, command: Command) -> None:
    asyncio.run(_run(database_url, command))


async def _run(database_url: str, command: Command) -> None:
    conn = await connect(database_url)
    try:
        await require_current_schema(conn)
        await command(conn)
    finally:
        await conn.close()


async def connect(database_url: str) -> asyncpg.Connection:
    try:
        conn = await asyncpg.connect(database_url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise BackendUnreachable(f"cannot reach the database ({exc}); check VIDJOBS_DATABASE_URL, or run "
                                 "`vidjobs up` for the embedded one") from exc
    await db.init_connection(conn)
    return conn


async def read_schema(database_url: str) -> db.Schema:
    conn = await connect(database_url)
    try:
        return await db.schema(conn)
    finally:
        await conn.close()


async def require_current_schema(conn: asyncpg.Connection) -> None:
    """Refuse to work on a schema this version was not written for. Nothing here migrates: applying this
    checkout's migrations to production is a rollout step, never a side effect of reading an account."""
    raise_if_mismatched(await db.schema(conn))


def raise_if_mismatched(schema: db.Schema) -> None:
    if schema.unknown:
        raise SchemaAhead(f"the database has migration(s) {_numbers(schema.unknown)} that this version does not "
                          "know: this checkout is older than the database; use the version that migrated it")
    if schema.missing:
        raise SchemaBehind(f"the database lacks migration(s) {_numbers(schema.missing)} that this version needs: "
                           "run `vidjobs migrate` (the services also migrate when they start)")


def _numbers(versions: Sequence[int]) -> str:
    return ", ".join(f"{v:04d}" for v in versions)


# service roles -----------------------------------------------------------------------------------------

async def service_roles(conn: asyncpg.Connection, *, sql_only: bool) -> None:
    """Give each service's role exactly its declared privileges and show what each holds; with `sql_only`,
    print the statements instead, for an administrator to run."""
    if sql_only:
        schema = await conn.fetchval("SELECT current_schema()")
        for service in grants.SERVICES:
            print(f"CREATE ROLE {grants.role(service)} NOLOGIN;")
        for statement in grants.statements(schema, await grants.sequences(conn)):
            print(f"{statement};")
        return
    changed = await grants.apply(conn)
    _note("service roles granted" if changed else "service roles already hold exactly their grants")
    held = await grants.held(conn)
    _table(("role", "table or function", "privileges"),
           [(grants.role(service), name, grants.listed(granted))
            for service in grants.SERVICES for name, granted in sorted(held[service].items())])


# accounts ----------------------------------------------------------------------------------------------

async def create_account(conn: asyncpg.Connection, name: str, *, credits: int, concurrency: int,
                         limits: dict[str, Any]) -> None:
    account_id, key = await accounts.create_account(conn, name, credits=credits, concurrency=concurrency,
                                                    **limits)
    _note(f"created account {account_id} ({name}); its API key is shown once, below")
    print(key)


async def list_accounts(conn: asyncpg.Connection, *, as_json: bool) -> None:
    rows = await accounts.list_accounts(conn)
    if as_json:
        _json_lines(rows)
        return
    _table(("id", "name", "balance", "reserved", "concurrency", "daily cap", "per-job max", "rate/s", "burst",
            "live keys", "active jobs"),
           [(a.id, a.name, a.credits_balance, a.credits_reserved, a.concurrent_jobs, a.daily_spend_cap,
             a.max_job_credits, a.requests_per_s, a.request_burst, a.live_keys, a.active_jobs) for a in rows])
    if not rows:
        _note("no accounts yet: `vidjobs accounts create NAME` makes one")


async def set_limits(conn: asyncpg.Connection, account_id: str, changes: dict[str, Any]) -> None:
    account = await accounts.update_limits(conn, account_id, **changes)
    if account is None:
        raise NotFound(_no_account(account_id))
    _note(f"{account.id} ({account.name}) now: concurrency {account.concurrent_jobs}, daily cap "
          f"{_cell(account.daily_spend_cap)}, per-job max {_cell(account.max_job_credits)}, rate/s "
          f"{_cell(account.requests_per_s)}, burst {_cell(account.request_burst)}, storage quota "
          f"{_cell(account.storage_quota_bytes)} (-: none or the default)")


async def delete_account(conn: asyncpg.Connection, account_id: str, *, purge: bool, wait_s: float,
                         settings: Settings, as_json: bool) -> None:
    """Close the account (keys revoked, live jobs canceled); with `purge`, then remove its objects and rows."""
    if await accounts.fetch(conn, account_id) is None:
        if purge:
            await _finish_purge(settings, account_id)
            return
        raise NotFound(_no_account(account_id))
    closed = await closing.close(conn, account_id)
    _note(f"{account_id}: {closed.keys_revoked} API key(s) revoked, {len(closed.jobs_canceled)} live job(s) "
          "canceled (their providers are asked to stop)")
    if not purge:
        _show_closed(closed, as_json=as_json)
        return
    storage = _storage(settings)
    try:
        await closing.settle(conn, account_id, wait_s)
        purged = await closing.purge(conn, storage, account_id)
    except closing.StillBusy as busy:
        raise Refused(f"{account_id} still has {busy} after {wait_s:g} s; nothing was purged. Run the command "
                      "again (with a longer --wait) once they have ended") from busy
    finally:
        await storage.close()
    _show_purged(purged, as_json=as_json)


async def _finish_purge(settings: Settings, account_id: str) -> None:
    """The account's rows are gone (an earlier purge committed them); objects a late copy stored may be left."""
    storage = _storage(settings)
    try:
        removed = await storage.delete_prefix(account_prefix(account_id))
    finally:
        await storage.close()
    if not removed:
        raise NotFound(_no_account(account_id))
    _note(f"no account {account_id!r}; removed {removed} object(s) left under its prefix")


def _storage(settings: Settings) -> Storage:
    # The file backend wants a key for the URLs it signs; removing objects signs none.
    return open_storage(settings.with_(signing_secret=settings.signing_secret or secrets.token_urlsafe(16)))


def _show_closed(closed: closing.Closed, *, as_json: bool) -> None:
    if as_json:
        print(msgspec.json.encode(closed).decode())
        return
    for job_id in closed.jobs_canceled:
        print(job_id)


def _show_purged(purged: closing.Purged, *, as_json: bool) -> None:
    if as_json:
        print(msgspec.json.encode(purged).decode())
        return
    _table(("removed", "count"), [("objects", purged.objects), *sorted(purged.rows.items())])


# keys --------------------------------------------------------------------------------------------------

async def create_key(conn: asyncpg.Connection, account_id: str, name: str) -> None:
    await _require_account(conn, account_id)
    key_id, key = await accounts.create_key(conn, account_id, name)
    _note(f"created {key_id} for {account_id}; the key is shown once, below, and stored only hashed")
    print(key)


async def list_keys(conn: asyncpg.Connection, account_id: str, *, as_json: bool) -> None:
    await _require_account(conn, account_id)
    keys = await accounts.list_keys(conn, account_id)
    if as_json:
        _json_lines(keys)
        return
    _table(("id", "name", "prefix", "created", "last used", "revoked"),
           [(k.id, k.name or None, k.prefix, k.created_at, k.last_used_at, k.revoked_at) for k in keys])


async def revoke_key(conn: asyncpg.Connection, key_id: str) -> None:
    revoked = await accounts.revoke_key(conn, key_id)
    if revoked is None:
        raise NotFound(f"no API key {key_id!r}; `vidjobs keys list ACCOUNT_ID` shows an account's keys")
    _note(f"revoked {key_id}: requests with it are refused from now on" if revoked
          else f"{key_id} was already revoked; nothing changed")


# platform keys -----------------------------------------------------------------------------------------

async def create_platform_key(conn: asyncpg.Connection, platform: str, scopes: list[str], name: str,
                              expires_in: timedelta | None) -> None:
    key_id, key = await platforms.create(conn, platform, scopes, name, expires_in)
    _note(f"created {key_id} for platform {platform} (scopes: {', '.join(scopes)}"
          f"{'' if expires_in is None else f'; expires in {_span(expires_in)}'}); the key is shown once, below, and "
          "stored only hashed")
    print(key)


async def list_platform_keys(conn: asyncpg.Connection, platform: str | None, *, as_json: bool) -> None:
    keys = await platforms.listed(conn, platform)
    if as_json:
        _json_lines(keys)
        return
    _table(("id", "platform", "name", "prefix", "scopes", "created", "last used", "expires", "revoked"),
           [(k.id, k.platform, k.name or None, k.prefix, ",".join(k.scopes), k.created_at, k.last_used_at,
             k.expires_at, k.revoked_at) for k in keys])
    if not keys:
        _note(f"no platform keys{'' if platform is None else f' for {platform!r}'}: "
              "`vidjobs platform-keys create --platform NAME --scopes ...` makes one")


async def revoke_platform_key(conn: asyncpg.Connection, key_id: str) -> None:
    revoked = await platforms.revoke(conn, key_id)
    if revoked is None:
        raise NotFound(_no_platform_key(key_id))
    _note(f"revoked {key_id}: refused within {platformkeys.CACHE_S:g} s on every gateway, with the browser "
          "tokens it issued" if revoked else f"{key_id} was already revoked; nothing changed")


async def rotate_platform_key(conn: asyncpg.Connection, key_id: str, overlap: timedelta) -> None:
    try:
        new_id, key = await platforms.rotate(conn, key_id, overlap)
    except StoreError as exc:
        if not await platforms.known(conn, key_id):
            raise NotFound(_no_platform_key(key_id)) from exc
        raise Refused(f"{key_id} is revoked or expired, so there is nothing to rotate; `vidjobs platform-keys "
                      "create` makes a new key") from exc
    _note(f"created {new_id} to replace {key_id}, which works for {_span(overlap)} more; the new key is shown once, "
          "below")
    print(key)


async def platform_audit(conn: asyncpg.Connection, platform: str | None, account_id: str | None, *, limit: int,
                         as_json: bool) -> None:
    platform_id = None
    if platform is not None and (platform_id := await platforms.platform_id(conn, platform)) is None:
        raise NotFound(f"no platform {platform!r}; `vidjobs platform-keys list` shows the platforms and their keys")
    lines = await audit.trail(conn, platform_id, account_id=account_id, before_id=None, limit=limit)
    if as_json:
        _json_lines(lines)
        return
    _table(("id", "at", "platform key", "action", "account", "status", "target", "request"),
           [(a.id, a.at, a.platform_key_id, a.action, a.account_id, a.status, a.target, a.request_id)
            for a in lines])


def _span(span: timedelta) -> str:
    """30d, 24h, 90m or 45s: the largest unit that says it exactly."""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _no_platform_key(key_id: str) -> str:
    return f"no platform key {key_id!r}; `vidjobs platform-keys list` shows them"


# credits -----------------------------------------------------------------------------------------------

async def grant(conn: asyncpg.Connection, account_id: str, amount: int, note: str) -> None:
    await _require_account(conn, account_id)
    entry = await credits.grant(conn, account_id, amount, note)
    _note(f"{'granted' if amount > 0 else 'took back'} {abs(amount)} credits; {account_id} has "
          f"{entry.balance_after} ({entry.reserved_after} reserved, "
          f"{entry.balance_after - entry.reserved_after} free)")
    print(entry.balance_after)


async def ledger(conn: asyncpg.Connection, account_id: str, *, limit: int, as_json: bool) -> None:
    await _require_account(conn, account_id)
    rows = await credits.entries(conn, account_id, limit=limit)
    if as_json:
        _json_lines(rows)
        return
    _table(("id", "at", "kind", "balance +/-", "reserved +/-", "balance", "reserved", "job", "note"),
           [(e.id, e.at, e.kind.value, e.balance_change, e.reserved_change, e.balance_after, e.reserved_after,
             e.job_id, e.note) for e in rows])


# what the platform spent ------------------------------------------------------------------------------

async def usage(conn: asyncpg.Connection, *, group_by: spending.GroupBy, start: datetime, end: datetime,
                as_json: bool) -> None:
    rows = await spending.report(conn, group_by, start, end)
    _note(f"jobs created from {_cell(start)} to {_cell(end)}, by {group_by.value}")
    if as_json:
        _json_lines(rows)
        return
    _table((group_by.value, "jobs", "attempts billed", "provider USD", "provider credits", "charged", "absorbed"),
           [(r.group, r.jobs, r.attempts_billed, Usd(r.provider_cost_usd), r.provider_cost_credits,
             r.credits_charged, r.credits_absorbed) for r in rows])


class Usd(float):
    """A dollar figure, shown to the cent."""

    def __str__(self) -> str:
        return f"{self:.2f}"


# the submission switch ---------------------------------------------------------------------------------

async def set_submissions(conn: asyncpg.Connection, *, paused: bool, reason: str) -> None:
    state = await switch.set_submissions(conn, paused=paused, reason=reason)
    _note(_describe(state))


async def submissions_status(conn: asyncpg.Connection, *, as_json: bool) -> None:
    state = await switch.submissions(conn)
    print(msgspec.json.encode(state).decode() if as_json else _describe(state))


def _describe(state: switch.Switch) -> str:
    if not state.paused:
        return f"submissions: running (since {_cell(state.changed_at)})"
    return (f"submissions: paused since {_cell(state.changed_at)}: {state.reason or 'no reason given'}; "
            "`vidjobs submissions resume` restarts them")


# the rate card -----------------------------------------------------------------------------------------

def read_rate_card(path: str) -> ratecard.RateCardIn:
    """The card in a JSON file, checked field by field; ConfigError names what is wrong."""
    try:
        card = msgspec.json.decode(Path(path).read_bytes(), type=ratecard.RateCardIn)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError; its message names the field
        raise ConfigError(f"{path}: {exc}; fix the file and run `vidjobs rates set` again") from exc
    seen: set[tuple[str, str]] = set()
    for i, price in enumerate(card.prices):
        if (price.model, price.resolution) in seen:
            raise ConfigError(f"{path}: {price.model} at {price.resolution} is priced twice - at `$.prices[{i}]`; "
                              "keep one price per model and resolution")
        seen.add((price.model, price.resolution))
    return card


async def set_rates(conn: asyncpg.Connection, card: ratecard.RateCardIn) -> None:
    number = await ratecard.publish(conn, card)
    _note(f"published rate card v{number}; jobs created from now on are priced by it")
    print(number)


async def show_rates(conn: asyncpg.Connection, *, as_json: bool) -> None:
    card = await ratecard.current(conn)
    if as_json:
        print(msgspec.json.encode(card).decode())
        return
    print(f"rate card v{card.version}, published {_cell(card.created_at)}, {card.credits_per_usd:g} credits per "
          f"USD{': ' + card.note if card.note else ''}")
    _table(("model", "resolution", "credits/s"),
           [(p.model, p.resolution, p.credits_per_second) for p in card.prices])


# output ------------------------------------------------------------------------------------------------

async def _require_account(conn: asyncpg.Connection, account_id: str) -> None:
    if await accounts.fetch(conn, account_id) is None:
        raise NotFound(_no_account(account_id))


def _no_account(account_id: str) -> str:
    return f"no account {account_id!r}; `vidjobs accounts list` shows the accounts"


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def _json_lines(rows: Sequence[msgspec.Struct]) -> None:
    for row in rows:
        print(msgspec.json.encode(row).decode())


def _cell(value: object) -> str:
    match value:
        case None:
            return "-"
        case datetime():
            return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        case Usd():
            return str(value)
        case float():
            return f"{value:g}"
        case _:
            return str(value)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [list(headers)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [bool(rows) and all(isinstance(row[i], int | float | None) for row in rows)
               for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))
        print(line.rstrip())
