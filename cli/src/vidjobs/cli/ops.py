"""Operator commands that fix things in one go, or show what a service recorded: dead letters, stored provider
callbacks and what providers told the poller, a stuck job, a provider's circuit breaker.

Like the commands in `admin`, each is a coroutine `__main__` hands to a runner: a database connection (the
schema checked first, never migrated) or, for the dead letters, which live in JetStream, a NATS connection.
Nothing here changes a job's status except through `transitions.transition` (by way of `rescue`), and
whatever a service must do next is handed to it as the same message it would get in the normal course.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import asyncpg
import msgspec
import nats
from nats.js import JetStreamContext

from vidjobs.cli.admin import _cell, _json_lines, _note, _table
from vidjobs.cli.exitcodes import BackendUnreachable, NotFound, Refused
from vidjobs.common import breakers, deadletters, jobs, outbox, rescue
from vidjobs.common.errors import ConfigError
from vidjobs.common.events import InboxReceived

T = TypeVar("T")

BusCommand = Callable[[JetStreamContext], Awaitable[None]]


def run_bus(nats_url: str, command: BusCommand) -> None:
    asyncio.run(_run_bus(nats_url, command))


async def _run_bus(nats_url: str, command: BusCommand) -> None:
    if not nats_url:
        raise ConfigError("dead letters are kept in NATS JetStream: set VIDJOBS_NATS_URL to the server the "
                          "services use")
    servers = [u.strip() for u in nats_url.split(",") if u.strip()]
    try:
        nc = await nats.connect(servers, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=0)
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise BackendUnreachable(f"cannot reach NATS at {nats_url} ({exc!r}); check VIDJOBS_NATS_URL") from exc
    try:
        await command(nc.jetstream(timeout=10))
    finally:
        await nc.close()


# dead letters ------------------------------------------------------------------------------------------

async def dead_list(js: JetStreamContext, *, as_json: bool) -> None:
    found = [letter async for letter in deadletters.letters(js)]
    if as_json:
        _json_lines(found)
        return
    _table(("id", "at", "consumer", "subject", "event", "job", "error"),
           [(d.id, d.at, d.consumer, d.subject, d.event, d.job_id, _short(d.error)) for d in found])
    if not found:
        _note("no dead letters")


async def dead_show(js: JetStreamContext, *, letter_id: int) -> None:
    letter = await deadletters.get(js, letter_id)
    if letter is None:
        raise NotFound(_no_letter(letter_id))
    print(msgspec.json.format(msgspec.json.encode(letter)).decode())


async def dead_replay(js: JetStreamContext, *, letter_id: int | None) -> None:
    """One dead letter, or (`letter_id` None) every one kept."""
    ids = [letter_id] if letter_id is not None else [d.id async for d in deadletters.letters(js)]
    for one in ids:
        letter = await deadletters.replay(js, one)
        if letter is None:
            raise NotFound(_no_letter(one))
        _note(f"replayed dead letter {one} ({letter.event or 'unreadable'}"
              f"{' for ' + letter.job_id if letter.job_id else ''}) to {letter.subject}")
        print(one)
    if not ids:
        _note("no dead letters to replay")


def _no_letter(letter_id: int) -> str:
    return f"no dead letter {letter_id}; `vidjobs dead list` shows them (a replayed one is gone)"


def _short(text: str, width: int = 60) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 1] + "…"


# the webhook inbox -------------------------------------------------------------------------------------

async def inbox_replay(conn: asyncpg.Connection, *, inbox_id: int) -> None:
    """Hand a stored provider callback to the poller again, as the gateway did when it arrived: the poller
    reads it, finds its job and applies it through the one signal path (a signal the job has gone past
    changes nothing)."""
    async with conn.transaction():
        provider = await conn.fetchval("SELECT provider FROM webhook_inbox WHERE id = $1", inbox_id)
        if provider is None:
            raise NotFound(f"no stored callback {inbox_id} (the inbox keeps callbacks for a limited time)")
        await outbox.add(conn, [InboxReceived(inbox_id=inbox_id, provider=provider)])
    _note(f"callback {inbox_id} from {provider} handed to the poller again; the services' outbox relay sends it")


class ProviderAnswer(msgspec.Struct, kw_only=True):
    """One row of what a provider told the poller (the poller's `provider_answers`)."""

    id: int
    kind: str  # poll: a status poll's answer; callback: a stored callback the poller handled
    provider: str
    provider_job_id: str | None
    job_id: str | None  # None: a callback about no job of ours
    inbox_id: int | None  # the stored callback (`vidjobs inbox replay` takes it)
    webhook_id: str | None  # the callback's delivery id, while the inbox keeps it
    state: str  # the provider's state as read, or "refused" for a status poll it refused
    answers: int  # identical answers in a row, or deliveries of one callback
    first_at: datetime
    last_at: datetime
    signal: dict[str, Any]  # the latest, as read, its strings cut
    # A callback naming a job id no row holds (a row lost in a failover): when the poller asked the provider to
    # stop the render; None when it did not (the render had ended, or the callback named no job of ours).
    stop_asked_at: datetime | None = None


_ANSWERS = """
SELECT a.id, a.kind, a.provider, a.provider_job_id, a.job_id, a.inbox_id, i.webhook_id, a.state, a.answers,
       a.first_at, a.last_at, a.signal::text AS signal, a.stop_asked_at
FROM provider_answers a LEFT JOIN webhook_inbox i ON i.id = a.inbox_id
"""


def _answers(rows: list[asyncpg.Record]) -> list[ProviderAnswer]:
    return [ProviderAnswer(**{**dict(r), "signal": msgspec.json.decode(r["signal"])}) for r in rows]


def _answer_table(answers: list[ProviderAnswer]) -> None:
    def error(signal: dict[str, Any]) -> str | None:
        said = signal.get("error")
        return f"{said.get('code')}: {_short(str(said.get('message', '')), 40)}" if isinstance(said, dict) else None
    _table(("at", "last", "kind", "n", "render", "state", "progress", "error", "inbox", "stop asked"),
           [(a.first_at, a.last_at if a.answers > 1 else None, a.kind, a.answers, a.provider_job_id, a.state,
             a.signal.get("progress"), error(a.signal), a.inbox_id, a.stop_asked_at) for a in answers])


async def inbox_show(conn: asyncpg.Connection, *, job_id: str, as_json: bool) -> None:
    """What the job's provider told us about it, oldest first: status polls' answers and the stored callbacks
    the poller matched to it."""
    job = await _job(conn, job_id)
    answers = _answers(await conn.fetch(_ANSWERS + "WHERE a.job_id = $1 ORDER BY a.id", job_id))
    if as_json:
        _json_lines(answers)
        return
    _answer_table(answers)
    if not answers:
        _note(f"nothing kept of what {job.provider} told us about {job_id}: rows go after "
              "VIDJOBS_WEBHOOK_RETENTION_DAYS, and a job keeps its newest VIDJOBS_PROVIDER_ANSWERS_PER_JOB")


async def inbox_unmatched(conn: asyncpg.Connection, *, provider: str | None, limit: int, as_json: bool) -> None:
    """Stored callbacks the poller matched to no job (a render we do not know), newest first."""
    answers = _answers(await conn.fetch(
        _ANSWERS + "WHERE a.kind = 'callback' AND a.job_id IS NULL AND ($1::text IS NULL OR a.provider = $1) "
                   "ORDER BY a.id DESC LIMIT $2", provider, limit))
    if as_json:
        _json_lines(answers)
        return
    _answer_table(answers)
    if not answers:
        _note("no callback for an unknown render is kept")


# stuck jobs --------------------------------------------------------------------------------------------

async def _job(conn: asyncpg.Connection, job_id: str) -> jobs.JobRow:
    job = await jobs.fetch(conn, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


async def _rescue(conn: asyncpg.Connection, job_id: str,
                  act: Callable[[jobs.JobRow], Awaitable[T]]) -> tuple[jobs.JobRow, T]:
    """The job as it was, and what `act` made of it, in one transaction; a job not stuck is refused."""
    async with conn.transaction():
        job = await _job(conn, job_id)
        try:
            return job, await act(job)
        except rescue.CannotRescue as exc:
            raise Refused(str(exc)) from exc


async def job_retry(conn: asyncpg.Connection, *, job_id: str, recovery_delay_s: float) -> None:
    job, done = await _rescue(conn, job_id, lambda job: rescue.retry(conn, job, recovery_delay_s=recovery_delay_s))
    _note(f"{job_id} ({job.status.value}, attempt {job.attempt}): {done}")


async def job_fail(conn: asyncpg.Connection, *, job_id: str, reason: str) -> None:
    job, ended = await _rescue(conn, job_id, lambda job: rescue.fail(conn, job, reason=reason))
    _note(f"{job_id} failed (was {job.status.value}); its reservation of {ended.estimated_credits} credits was "
          f"released and {ended.actual_credits or 0} charged")


# What `jobs inspect` shows beside the row: (title, query by job id). Each table belongs to one service;
# reading them all in one place is what this command is for.
_AROUND_A_JOB: tuple[tuple[str, str], ...] = (
    ("transitions", "SELECT at, from_status, to_status, reason FROM job_transitions WHERE job_id = $1 ORDER BY id"),
    ("outbox (staged, not yet published)",
     "SELECT id, subject, convert_from(payload, 'UTF8') AS event, created_at FROM outbox "
     "WHERE convert_from(payload, 'UTF8')::jsonb ->> 'job_id' = $1 ORDER BY id"),
    ("provider submissions",
     "SELECT attempt, provider, provider_job_id, claimed_at, answered_at, error ->> 'code' AS error "
     "FROM provider_submissions WHERE job_id = $1 ORDER BY attempt"),
    ("poll schedule", "SELECT next_poll_at, started_at, polls FROM poll_schedule WHERE job_id = $1"),
    ("provider answers (`vidjobs inbox show`)",
     "SELECT first_at, last_at, kind, answers, provider_job_id, state, inbox_id FROM provider_answers "
     "WHERE job_id = $1 ORDER BY id"),
    ("recovery lease", "SELECT owner, expires_at FROM recovery_leases WHERE job_id = $1"),
    ("assets", "SELECT kind, key, bytes, sha256, created_at FROM assets WHERE job_id = $1 ORDER BY id"),
    ("credit", "SELECT at, kind, balance_change, reserved_change, note FROM credit_ledger WHERE job_id = $1 "
               "ORDER BY id"),
)
_TIMERS = ("recover_at", "retry_at", "deadline_at", "waited_at", "submitted_at", "completed_at", "deleted_at")


async def job_inspect(conn: asyncpg.Connection, *, job_id: str, as_json: bool) -> None:
    job = await _job(conn, job_id)
    around = {title: [dict(r) for r in await conn.fetch(sql, job_id)] for title, sql in _AROUND_A_JOB}
    if as_json:
        print(msgspec.json.encode({"job": job, **around}).decode())
        return
    _fields(job)
    for title, rows in around.items():
        print(f"\n{title}:")
        if rows:
            _table(tuple(rows[0]), [tuple(r.values()) for r in rows])
        else:
            print("  none")


def _fields(job: jobs.JobRow) -> None:
    shown = ["id", "account_id", "status", "model", "attempt", "provider_job_id", "wait_reason", "progress",
             "error", "estimated_credits", "actual_credits", "created_at", "updated_at", *_TIMERS]
    width = max(map(len, shown))
    for name in shown:
        value: Any = getattr(job, name)
        if name == "error" and value is not None:
            value = f"{value.code.value}: {value.message}"
        print(f"{name.ljust(width)}  {_cell(value)}")


# circuit breakers --------------------------------------------------------------------------------------

async def breakers_list(conn: asyncpg.Connection, *, as_json: bool) -> None:
    rows = await breakers.list_all(conn)
    if as_json:
        _json_lines(rows)
        return
    _table(("provider", "state", "failures", "opened", "reopens", "probe job", "cooldown s", "opened by"),
           [(b.provider, b.state.value, b.failures, b.opened_at, b.reopen_at, b.probe_job_id, b.cooldown_s, b.cause)
            for b in rows])
    if not rows:
        _note("no provider has tripped a breaker yet")


async def breakers_reset(conn: asyncpg.Connection, *, provider: str) -> None:
    async with conn.transaction():
        was = {b.provider: b for b in await breakers.list_all(conn)}.get(provider)
        if was is None or await breakers.reset(conn, provider) is None:
            raise NotFound(f"no breaker for {provider!r}: it has never been tripped; `vidjobs breakers list`")
    _note(f"{provider}: breaker closed (was {was.state.value}, {was.failures} failures); submissions flow again")
