"""The operator's changes of the model routes (`vidjobs routes set|disable|enable`) and their history.

Each change is one transaction: checked whole, written whole, with its row in `model_route_changes` (who,
what, when, the alias's routes before and after); a change refused leaves everything as it was. A change
sets the version of the rows it writes to its own id, which deals every account of the alias again
(vidjobs.providers.rollout), and the table's trigger tells the gateways at commit. Runs as the migrator:
no service updates or deletes routes (grants.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import modelroutes
from vidjobs.common.errors import ConfigError, StoreError
from vidjobs.common.modelroutes import RouteRow, RouteState

_ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._:/-]*")
MAX_ALIAS = 100
MAX_SHARE = 1_000_000


class NoSuchRoute(StoreError):
    """The route named is in no alias."""


class RouteRefused(StoreError):
    """The change would leave the routes unusable; the message says why."""


class RouteChange(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    at: datetime
    alias: str
    action: str
    actor: str
    db_user: str
    reason: str
    before: list[RouteState]
    after: list[RouteState]


def check_set(alias: str, shares: Mapping[str, int], known: frozenset[str]) -> None:
    """ConfigError naming the first thing wrong with `vidjobs routes set ALIAS ROUTE=SHARE...`."""
    if len(alias) > MAX_ALIAS or not _ALIAS.fullmatch(alias):
        raise ConfigError(f"alias {alias!r}: name it as <family>/<name> (letters, digits, '.', '_', '-'), at "
                          f"most {MAX_ALIAS} characters, like house/default")
    if alias in known:
        raise ConfigError(f"alias {alias!r} is a real model: an alias of that name would take its jobs away "
                          "from it; choose another name")
    if not shares:
        raise ConfigError(f"{alias}: name at least one route, as MODEL=SHARE")
    if unknown := sorted(m for m in shares if m not in known):
        raise ConfigError(f"{alias}: unknown model(s) {', '.join(unknown)}: a route is a real model "
                          "(`vidjobs models` or GET /v1/models lists them)")
    for model, share in shares.items():
        if not 0 <= share <= MAX_SHARE:
            raise ConfigError(f"{alias}: the share of {model} is {share}; shares are whole numbers from 0 to "
                              f"{MAX_SHARE}")
    if sum(shares.values()) <= 0:
        raise ConfigError(f"{alias}: the shares add up to 0; give at least one route a share above 0 "
                          "(to take a route out, leave it off or `vidjobs routes disable` it)")


async def _alias_rows(conn: asyncpg.Connection, alias: str) -> list[RouteRow]:
    return [r for r in await modelroutes.rows(conn) if r.alias == alias]


async def _record(conn: asyncpg.Connection, alias: str, action: str, actor: str, reason: str,
                  before: list[RouteState], after: list[RouteState]) -> int:
    change_id: int = await conn.fetchval(
        """
        INSERT INTO model_route_changes (alias, action, actor, reason, before, after)
        VALUES ($1, $2, $3, $4, $5, $6) RETURNING id
        """,
        alias, action, actor, reason, msgspec.to_builtins(before), msgspec.to_builtins(after))
    return change_id


async def set_routes(conn: asyncpg.Connection, alias: str, shares: Mapping[str, int], *, known: frozenset[str],
                     actor: str, reason: str = "") -> RouteChange | None:
    """Make `shares` the alias's routes, every one enabled; routes it had and `shares` leaves out are
    removed. None when that is what it has already (nothing recorded). Checks first (check_set)."""
    check_set(alias, shares, known)
    async with conn.transaction():
        await modelroutes.lock(conn)
        every = await modelroutes.rows(conn)
        if chained := sorted(m for m in shares if any(r.alias == m for r in every)):
            raise ConfigError(f"{alias}: {', '.join(chained)} is itself an alias; name the real models")
        before = modelroutes.states([r for r in every if r.alias == alias])
        after = sorted((RouteState(model=m, share=s, enabled=True) for m, s in shares.items()),
                       key=lambda s: s.model)
        if before == after:
            return None
        change_id = await _record(conn, alias, "set", actor, reason, before, after)
        await conn.execute("DELETE FROM model_routes WHERE alias = $1 AND NOT (model = ANY($2::text[]))",
                           alias, list(shares))
        await conn.executemany(
            """
            INSERT INTO model_routes (alias, model, share, enabled, version, changed_at)
            VALUES ($1, $2, $3, true, $4, now())
            ON CONFLICT (alias, model) DO UPDATE
                SET share = excluded.share, enabled = true, version = excluded.version, changed_at = now()
            """,
            [(alias, s.model, s.share, change_id) for s in after])
    return await _change(conn, change_id)


async def set_enabled(conn: asyncpg.Connection, model: str, *, enabled: bool, alias: str | None, actor: str,
                      reason: str = "") -> list[RouteChange]:
    """Disable (or enable again) the route to `model` in every alias that has it, or in `alias` alone; its
    share is kept, so enabling restores it. Refused whole if an alias would be left with no route to pick."""
    action = "enable" if enabled else "disable"
    async with conn.transaction():
        await modelroutes.lock(conn)
        every = await modelroutes.rows(conn)
        hit = sorted({r.alias for r in every if r.model == model and (alias is None or r.alias == alias)})
        if not hit:
            where = f"alias {alias}" if alias else "any alias"
            raise NoSuchRoute(f"no route to {model} in {where}; `vidjobs routes list` shows the routes")
        changed = []
        for name in hit:
            rows = [r for r in every if r.alias == name]
            before = modelroutes.states(rows)
            after = [RouteState(s.model, s.share, enabled if s.model == model else s.enabled) for s in before]
            if before == after:
                continue
            if not any(s.enabled and s.share > 0 for s in after):
                raise RouteRefused(f"{name}: {model} is its only route with a share; disabling it would leave "
                                   f"{name} with nothing to render on. Give another route a share first "
                                   f"(`vidjobs routes set {name} OTHER=SHARE ...`); nothing was changed")
            change_id = await _record(conn, name, action, actor, reason, before, after)
            await conn.execute(
                "UPDATE model_routes SET enabled = $3, version = $4, changed_at = now() "
                "WHERE alias = $1 AND model = $2", name, model, enabled, change_id)
            changed.append(change_id)
    return [await _change(conn, c) for c in changed]


_CHANGES = "SELECT id, at, alias, action, actor, db_user, reason, before, after FROM model_route_changes"


async def _change(conn: asyncpg.Connection, change_id: int) -> RouteChange:
    row = await conn.fetchrow(f"{_CHANGES} WHERE id = $1", change_id)
    assert row is not None, "written in this transaction or before"
    return msgspec.convert(dict(row), RouteChange)


async def history(conn: asyncpg.Connection, *, alias: str | None, limit: int) -> list[RouteChange]:
    """The newest changes first, of every alias or of one."""
    found = await conn.fetch(f"{_CHANGES} WHERE $1::text IS NULL OR alias = $1 ORDER BY id DESC LIMIT $2",
                             alias, limit)
    return [msgspec.convert(dict(r), RouteChange) for r in found]
