"""`vidjobs routes`: the model routes every gateway picks from, changed while they run.

`list` shows each alias's routes; `set` replaces an alias's routes and shares; `disable` takes a route out of
every alias that has it (a rollback: its share goes to the others) and `enable` puts it back with its share;
`history` shows every change; `compare` sets an alias's routes side by side (vidjobs.common.routecompare).
A change reaches every gateway within a second or so (it is announced at commit), and within
VIDJOBS_ROUTES_REFRESH_S at worst. Like the other operator commands these run on the database as the migrator.
"""

from __future__ import annotations

import asyncio
import getpass
import re
import socket
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from vidjobs.cli.admin import _cell, _json_lines, _note, _table
from vidjobs.cli.exitcodes import NotFound
from vidjobs.common import modelroutes, routechanges
from vidjobs.common.errors import ConfigError
from vidjobs.common.routechanges import RouteChange
from vidjobs.common.routecompare import RouteFigures, compare
from vidjobs.providers.registry import every_model

_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def actor() -> str:
    """Who is changing the routes, for the history: the login and the machine."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name in this environment (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def known_models() -> frozenset[str]:
    """The models a route may name: every adapter's, offered here or not (the gateways pass over a route to a
    model they do not offer)."""
    return asyncio.run(every_model())


def parse_shares(pairs: list[str]) -> dict[str, int]:
    """`MODEL=SHARE` arguments as a mapping; ConfigError naming the first malformed one."""
    out: dict[str, int] = {}
    for pair in pairs:
        model, sep, share = pair.rpartition("=")
        if not sep or not model:
            raise ConfigError(f"{pair!r}: give each route as MODEL=SHARE, like fake/default=95")
        if not re.fullmatch(r"\d{1,9}", share.strip()):
            raise ConfigError(f"{pair!r}: the share must be a whole number, 0 or more, not {share!r}")
        if model in out:
            raise ConfigError(f"{model} is named twice; give each route once")
        out[model] = int(share)
    return out


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`24h`, `7d`, `90m`, `30s` ago, or an ISO 8601 moment (UTC unless it says otherwise)."""
    now = now or datetime.now(UTC)
    if found := _AGO.fullmatch(text.strip()):
        return now - timedelta(seconds=float(found[1]) * _UNIT_S[found[2]])
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--since {text!r}: give a span back from now (30m, 24h, 7d) or an ISO 8601 time "
                          "(2025-06-01T12:00:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# list --------------------------------------------------------------------------------------------------

class ListedRoute(msgspec.Struct, frozen=True, kw_only=True):
    alias: str
    model: str
    share: int
    enabled: bool
    percent: float  # of the alias's accounts this route takes now
    version: int


async def list_routes(conn: asyncpg.Connection, *, as_json: bool) -> None:
    found = await modelroutes.rows(conn)
    table = modelroutes.table_of(found)
    listed = []
    for row in found:
        picks = table.get(row.alias)
        total = sum(s.share for s in picks.shares) if picks else 0
        live = row.enabled and row.share > 0 and total > 0
        listed.append(ListedRoute(alias=row.alias, model=row.model, share=row.share, enabled=row.enabled,
                                  percent=round(100 * row.share / total, 2) if live else 0.0,
                                  version=picks.version if picks else row.version))
    if as_json:
        _json_lines(listed)
        return
    _table(("alias", "route", "share", "enabled", "% of accounts", "version"),
           [(r.alias, r.model, r.share, "yes" if r.enabled else "no", r.percent, r.version) for r in listed])
    if not listed:
        _note("no model routes: `vidjobs routes set ALIAS MODEL=SHARE ...` makes one (VIDJOBS_MODEL_ROUTES seeds "
              "them when a gateway starts)")


# changes -----------------------------------------------------------------------------------------------

async def set_routes(conn: asyncpg.Connection, *, alias: str, shares: dict[str, int], known: frozenset[str],
                     reason: str) -> None:
    change = await routechanges.set_routes(conn, alias, shares, known=known, actor=actor(), reason=reason)
    if change is None:
        _note(f"{alias} already has exactly these routes; nothing changed")
        return
    _note(f"{alias}: {_describe(change.before)} -> {_describe(change.after)} (change {change.id}); every "
          "gateway routes by it within seconds, each account dealt again")
    print(change.id)


async def set_enabled(conn: asyncpg.Connection, *, model: str, enabled: bool, alias: str | None,
                      reason: str) -> None:
    try:
        changes = await routechanges.set_enabled(conn, model, enabled=enabled, alias=alias, actor=actor(),
                                                 reason=reason)
    except routechanges.NoSuchRoute as exc:
        raise NotFound(str(exc)) from exc
    if not changes:
        _note(f"{model} is already {'enabled' if enabled else 'disabled'} there; nothing changed")
    for change in changes:
        _note(f"{change.alias}: {_describe(change.before)} -> {_describe(change.after)} (change {change.id})")
        print(change.id)


def _describe(states: list[modelroutes.RouteState]) -> str:
    if not states:
        return "(none)"
    return ", ".join(f"{s.model}={s.share}{'' if s.enabled else ' (disabled)'}" for s in states)


async def history(conn: asyncpg.Connection, *, alias: str | None, limit: int, as_json: bool) -> None:
    changes: list[RouteChange] = await routechanges.history(conn, alias=alias, limit=limit)
    if as_json:
        _json_lines(changes)
        return
    _table(("id", "at", "alias", "action", "by", "db user", "before", "after", "reason"),
           [(c.id, c.at, c.alias, c.action, c.actor, c.db_user, _describe(c.before), _describe(c.after),
             c.reason or None) for c in changes])
    if not changes:
        _note("no changes of the model routes yet")


# compare -----------------------------------------------------------------------------------------------

async def compare_routes(conn: asyncpg.Connection, *, alias: str, since: datetime, window_s: float,
                         as_json: bool) -> None:
    figures = await compare(conn, alias, since=since, window_s=window_s)
    if as_json:
        _json_lines(figures)
        return
    _note(f"{alias}: jobs created since {_cell(since)}; render = submitted to rendered (the estimates' hold), "
          f"ready = created to completed, in seconds; regenerated within {window_s:g} s")
    _table(("route", "jobs", "completed", "failed", "render p50", "render p90", "ready p50", "ready p90",
            "failure rate", "regenerate rate", "credits/job", "provider cost/job", "failures by code"),
           [_row(f) for f in figures])
    if not figures:
        _note(f"no jobs came through {alias} in that time")


def _row(f: RouteFigures) -> tuple[object, ...]:
    codes = ", ".join(f"{code} {_percent(rate)}" for code, rate in f.failures_by_code.items()) or None
    return (f.model, f.jobs, f.completed, f.failed, _seconds(f.render_p50_s), _seconds(f.render_p90_s),
            _seconds(f.ready_p50_s), _seconds(f.ready_p90_s), _percent(f.failure_rate),
            _percent(f.regenerate_rate), _round(f.credits_per_job), _round(f.provider_cost_per_job), codes)


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.1f}%"
