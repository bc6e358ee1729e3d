"""Model routes as rows: which real models an alias sends its jobs to, and in what shares.

An alias (`house/default`) has one row per route (`fake/default`, `luma/ray-2`) with a share and an enabled
flag; only enabled routes with a share above 0 take jobs, so disabling a route hands its share to the others.
The gateways read the table (and keep it in memory, vidjobs.gateway.liveroutes); operators change it with
`vidjobs routes` (vidjobs.common.routechanges), every change kept in `model_route_changes`.

VIDJOBS_MODEL_ROUTES is the seed: a gateway starting writes each alias of the setting that has no rows yet,
as a `seed` change. Once an alias has rows the table is what counts and the setting is no longer read for it
(a gateway whose setting says otherwise logs that once at start), so `vidjobs up` and a fresh deployment work
from the setting alone, and a change made with the command survives every restart.

This module is what a gateway runs: reads, and the seed (INSERT only). The operator's changes live apart.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping, Sequence

import asyncpg
import msgspec

from vidjobs.common import db
from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import RouteShare

log = logging.getLogger("vidjobs.modelroutes")

# The channel a change of model_routes is announced on (migration 0022's trigger), for the gateways to reread.
CHANNEL = "vidjobs_model_routes"
# Taken by every writer of the routes (a seed, an operator's change) for its transaction: two gateways
# starting at once do not both seed one alias, and a change is checked against the routes it replaces.
_WRITE_LOCK = 0x726F75746573


class RouteRow(msgspec.Struct, frozen=True, kw_only=True):
    alias: str
    model: str
    share: int
    enabled: bool
    version: int


class RouteState(msgspec.Struct, frozen=True):
    """One route as a change records it, before or after."""

    model: str
    share: int
    enabled: bool


class AliasRoutes(msgspec.Struct, frozen=True):
    """What an alias picks from: its version, and its enabled routes with a share, ordered by model so that
    every replica lays the shares out the same way."""

    version: int
    shares: tuple[RouteShare, ...]


Table = Mapping[str, AliasRoutes]

_ROWS = "SELECT alias, model, share, enabled, version FROM model_routes ORDER BY alias, model"


async def rows(conn: asyncpg.Connection | asyncpg.Pool) -> list[RouteRow]:
    return [RouteRow(**dict(r)) for r in await conn.fetch(_ROWS)]


def table_of(found: Sequence[RouteRow], usable: frozenset[str] | None = None) -> dict[str, AliasRoutes]:
    """Each alias's pick: its enabled routes with a share, and (with `usable`) only the models a process can
    render with. An alias left with nothing to pick is absent: its name is then no model at all."""
    by_alias: dict[str, list[RouteRow]] = {}
    for row in found:
        by_alias.setdefault(row.alias, []).append(row)
    out = {}
    for alias, routes in by_alias.items():
        shares = tuple(RouteShare(model=r.model, share=r.share) for r in sorted(routes, key=lambda r: r.model)
                       if r.enabled and r.share > 0 and (usable is None or r.model in usable))
        if shares:
            out[alias] = AliasRoutes(version=max(r.version for r in routes), shares=shares)
    return out


def states(found: Sequence[RouteRow]) -> list[RouteState]:
    return [RouteState(model=r.model, share=r.share, enabled=r.enabled) for r in sorted(found, key=lambda r: r.model)]


def seed_shares(alias: str, shares: Sequence[RouteShare]) -> list[RouteState]:
    """The setting's routes for `alias` as rows; ConfigError for a share a row cannot hold."""
    out: dict[str, RouteState] = {}
    for share in shares:
        if share.share < 0 or share.share != int(share.share):
            raise ConfigError(f"VIDJOBS_MODEL_ROUTES: {alias}: the share of {share.model} is {share.share:g}; "
                              "shares are whole numbers, 0 or more")
        if share.model in out:
            raise ConfigError(f"VIDJOBS_MODEL_ROUTES: {alias}: {share.model} is named twice")
        out[share.model] = RouteState(model=share.model, share=int(share.share), enabled=True)
    if not any(s.share > 0 for s in out.values()):
        raise ConfigError(f"VIDJOBS_MODEL_ROUTES: {alias}: no route has a share above 0")
    return sorted(out.values(), key=lambda s: s.model)


def check_seed(setting: Mapping[str, Sequence[RouteShare]]) -> dict[str, list[RouteState]]:
    """The whole setting as rows, checked before anything is written."""
    return {alias: seed_shares(alias, shares) for alias, shares in setting.items()}


async def lock(conn: asyncpg.Connection) -> None:
    """Hold the routes' write lock until the caller's transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _WRITE_LOCK)


async def seed(pool: asyncpg.Pool, setting: Mapping[str, Sequence[RouteShare]], actor: str | None = None) -> list[str]:
    """Write each alias of the setting that has no rows yet, with a `seed` change; returns the aliases
    seeded. An alias that has rows keeps them: where they differ from the setting, that is logged."""
    wanted = check_seed(setting)
    if not wanted:
        return []
    who = actor or f"gateway@{socket.gethostname()}"
    seeded = []
    async with pool.acquire() as lent, lent.transaction():
        conn = db.lent(lent)
        await lock(conn)
        held: dict[str, list[RouteRow]] = {}
        for row in await rows(conn):
            held.setdefault(row.alias, []).append(row)
        for alias, routes in wanted.items():
            if alias in held:
                if states(held[alias]) != routes:
                    log.info("model routes: the table, not VIDJOBS_MODEL_ROUTES, decides this alias",
                             extra={"alias": alias, "table": msgspec.to_builtins(states(held[alias]))})
                continue
            await _write_seed(conn, alias, routes, who)
            seeded.append(alias)
    if seeded:
        log.info("model routes seeded from VIDJOBS_MODEL_ROUTES", extra={"aliases": seeded})
    return seeded


async def _write_seed(conn: asyncpg.Connection, alias: str, routes: list[RouteState], actor: str) -> None:
    await conn.executemany(
        "INSERT INTO model_routes (alias, model, share, enabled, version) VALUES ($1, $2, $3, true, 0)",
        [(alias, r.model, r.share) for r in routes])
    await conn.execute(
        "INSERT INTO model_route_changes (alias, action, actor, before, after) VALUES ($1, 'seed', $2, $3, $4)",
        alias, actor, [], msgspec.to_builtins(routes))
