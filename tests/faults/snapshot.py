"""What PostgreSQL holds about a history's accounts and jobs at the end of a run, read once, for the history
checker's promises (promises.py) to judge without reading anything themselves."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from tests.faults.history import History


@dataclass(frozen=True)
class Job:
    id: str
    account_id: str
    status: str
    deleted: bool
    wait_reason: str | None
    error_code: str | None
    actual_credits: int | None


@dataclass(frozen=True)
class Move:
    from_status: str | None  # None: the job's creation
    to_status: str
    stage: str | None  # the stage it left the job at; None for creation (and moves of an older release)
    at: datetime


@dataclass(frozen=True)
class Entry:
    """A credit ledger entry."""

    account_id: str
    job_id: str | None
    kind: str
    balance_change: int
    reserved_change: int
    at: datetime


@dataclass(frozen=True)
class Asset:
    job_id: str
    kind: str
    key: str
    bytes: int
    sha256: str
    deleted: bool


@dataclass(frozen=True)
class Endpoint:
    id: str
    account_id: str
    events: tuple[str, ...]
    created_at: datetime
    disabled_at: datetime | None
    deleted_at: datetime | None


@dataclass(frozen=True)
class Delivery:
    id: str
    endpoint_id: str
    job_id: str
    event_type: str
    status: str  # pending | delivered | failed | disabled


@dataclass
class Snapshot:
    jobs: dict[str, Job] = field(default_factory=dict)  # the acknowledged jobs and every job of the accounts
    trails: dict[str, list[Move]] = field(default_factory=dict)
    balances: dict[str, tuple[int, int]] = field(default_factory=dict)  # account -> (balance, reserved)
    ledger: list[Entry] = field(default_factory=list)
    assets: list[Asset] = field(default_factory=list)
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)


async def read(database_url: str, history: History) -> Snapshot:
    conn = await asyncpg.connect(database_url)
    try:
        return await _read(conn, history)
    finally:
        await conn.close()


async def _read(conn: asyncpg.Connection, history: History) -> Snapshot:
    snap = Snapshot()
    accounts = list(history.accounts)
    for r in await conn.fetch(
            "SELECT id, account_id, status::text, deleted_at IS NOT NULL AS deleted, wait_reason, "
            "error->>'code' AS code, actual_credits FROM jobs WHERE id = ANY($1) OR account_id = ANY($2)",
            list(history.acknowledged), accounts):
        snap.jobs[r["id"]] = Job(r["id"], r["account_id"], r["status"], r["deleted"], r["wait_reason"], r["code"],
                                 r["actual_credits"])
    for r in await conn.fetch("SELECT job_id, from_status::text AS f, to_status::text AS t, stage::text AS s, at "
                              "FROM job_transitions WHERE job_id = ANY($1) ORDER BY id", list(snap.jobs)):
        snap.trails.setdefault(r["job_id"], []).append(Move(r["f"], r["t"], r["s"], r["at"]))
    for r in await conn.fetch("SELECT id, credits_balance, credits_reserved FROM accounts WHERE id = ANY($1)",
                              accounts):
        snap.balances[r["id"]] = (r["credits_balance"], r["credits_reserved"])
    snap.ledger = [Entry(r["account_id"], r["job_id"], r["kind"], r["balance_change"], r["reserved_change"], r["at"])
                   for r in await conn.fetch(
                       "SELECT account_id, job_id, kind::text, balance_change, reserved_change, at FROM credit_ledger "
                       "WHERE account_id = ANY($1) ORDER BY id", accounts)]
    snap.assets = [Asset(r["job_id"], r["kind"], r["key"], r["bytes"], r["sha256"], r["deleted"])
                   for r in await conn.fetch("SELECT job_id, kind, key, bytes, sha256, deleted_at IS NOT NULL "
                                             "AS deleted FROM assets WHERE job_id = ANY($1)", list(snap.jobs))]
    for r in await conn.fetch("SELECT id, account_id, events, created_at, disabled_at, deleted_at "
                              "FROM webhook_endpoints WHERE id = ANY($1) OR account_id = ANY($2)",
                              list(history.endpoints), accounts):
        snap.endpoints[r["id"]] = Endpoint(r["id"], r["account_id"], tuple(r["events"]), r["created_at"],
                                           r["disabled_at"], r["deleted_at"])
    snap.deliveries = [Delivery(r["id"], r["endpoint_id"], r["job_id"], r["event_type"], r["status"])
                       for r in await conn.fetch(
                           "SELECT id, endpoint_id, job_id, event_type, status FROM webhook_deliveries "
                           "WHERE endpoint_id = ANY($1)", list(snap.endpoints))]
    return snap
