"""Provider circuit breakers: the whole state machine, over the one row per provider that every submitter
replica obeys and an operator sees and resets.

    closed --(breaker_threshold failures in a row, or one refusal)--> open
    open --(its pause runs out; a job asks)--> half_open
    half_open --(the probe job fails or is refused)--> open, for twice as long (capped at MAX_COOLDOWN_S)
    any --(any other answer from the provider, or an operator's reset)--> closed

A failure is a provider_unavailable or timeout answer to a submission. A refusal is the provider refusing our
account itself (out of credit, our key refused): every call would meet it until an operator acts, so the
first one opens the breaker, and its jobs wait rather than each be refused in turn. Open, the provider takes
nothing until its pause runs out; then the first job to ask becomes the one probe that tests it (half open),
which is how work flows again once the key or the credit is put right. A probe that never reports back is
replaced once its lease runs out. The row keeps what opened it (`cause`), which the waiting jobs' reason says.

States reach SQL only through `sql()`, like job statuses (states.py).
"""

from __future__ import annotations

import enum
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import outbox, waiting
from vidjobs.common.errors import ErrorCode
from vidjobs.common.settings import Settings

MAX_COOLDOWN_S = 600.0
# How long a half-open breaker waits for its probe's answer before another job may probe instead.
PROBE_LEASE_S = 60.0
# How long a job waits, at most, before looking again while another job probes.
PROBE_LOOK_S = 5.0
# Answers that count as the provider failing; every other answer shows it is up.
FAILURES = frozenset({ErrorCode.PROVIDER_UNAVAILABLE, ErrorCode.TIMEOUT})
# Answers that say the provider refuses our account, whatever the request: one opens the breaker.
REFUSALS = frozenset({ErrorCode.QUOTA_EXHAUSTED, ErrorCode.PROVIDER_MISCONFIGURED})
# Why a refused provider holds its jobs back, in words, by what opened its breaker; any other cause (or none,
# from a release before causes were kept) is an outage.
_REFUSED_WHY = {
    ErrorCode.QUOTA_EXHAUSTED: "refused us: our account with it is out of credit",
    ErrorCode.PROVIDER_MISCONFIGURED: "refused our credentials or our call",
}


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # submissions flow
    OPEN = "open"  # paused after repeated provider_unavailable, or a refusal; one probe when reopen_at comes
    HALF_OPEN = "half_open"  # one probe job is testing the provider


def sql(state: BreakerState) -> str:
    """A state written into SQL text (`'open'`): spelled from the enum, so a state has one spelling."""
    return f"'{state.value}'"


SQL_CLOSED = sql(BreakerState.CLOSED)


def pausing_sql(alias: str) -> str:
    """The predicate of a breaker row (`alias`) that holds every job of its provider back now: open with its
    pause still running, or half open with a probe out."""
    return f"{alias}.state <> {SQL_CLOSED} AND {alias}.reopen_at > clock_timestamp()"


class Breaker(msgspec.Struct, kw_only=True):
    provider: str
    state: BreakerState
    failures: int  # consecutive provider_unavailable or timeout answers
    opened_at: datetime | None
    reopen_at: datetime | None  # open: when one probe may go; half open: when a silent probe is replaced
    probe_job_id: str | None
    cooldown_s: float
    # The code of the answer that last opened it; None while closed. Text, not the enum: a code a later release
    # adds must not stop this one reading the row.
    cause: str | None = None


class Admission(msgspec.Struct, frozen=True):
    """What the breaker says to one job: go (`wait_s` None), or wait that long for the reason given.
    `probe`: the job goes as the one that tests a provider that was down. `starts_probe`: it goes as that
    probe only once `start_probe` has recorded it (the pause has run out and no probe is out)."""

    wait_s: float | None = None
    reason: str | None = None
    probe: bool = False
    starts_probe: bool = False


GO = Admission()


async def read(conn: asyncpg.Connection | asyncpg.Pool, provider: str) -> Breaker | None:
    """The provider's breaker; None if it never failed (closed)."""
    row = await conn.fetchrow("SELECT * FROM provider_breakers WHERE provider = $1", provider)
    return None if row is None else msgspec.convert(dict(row), Breaker)


async def list_all(conn: asyncpg.Connection) -> list[Breaker]:
    rows = await conn.fetch("SELECT * FROM provider_breakers ORDER BY provider")
    return [msgspec.convert(dict(r), Breaker) for r in rows]


async def pausing(conn: asyncpg.Connection | asyncpg.Pool, provider: str) -> bool:
    """Whether the provider's breaker holds every job back now (`pausing_sql`)."""
    return bool(await conn.fetchval(
        f"SELECT {pausing_sql('b')} FROM provider_breakers b WHERE b.provider = $1", provider))


def admission(breaker: Breaker | None, job_id: str, now: datetime) -> Admission:
    """What the breaker says to `job_id` at `now`. Reads nothing and writes nothing: an answer with
    `starts_probe` needs `start_probe` in the same transaction, under the provider's lock."""
    if breaker is None or breaker.state is BreakerState.CLOSED:
        return GO
    if breaker.state is BreakerState.HALF_OPEN and breaker.probe_job_id == job_id:
        return Admission(probe=True)
    if breaker.reopen_at is None or breaker.reopen_at <= now:
        # The pause is over (or the last probe never reported back): this job is the probe.
        return Admission(probe=True, starts_probe=True)
    wait = (breaker.reopen_at - now).total_seconds()
    refused = _REFUSED_WHY.get(ErrorCode(breaker.cause)) if breaker.cause in _REFUSED_WHY else None
    if breaker.state is BreakerState.OPEN:
        return Admission(wait, f"{breaker.provider} {refused or 'is unavailable'}; submissions paused until "
                               f"{breaker.reopen_at:%H:%M:%S} UTC, then one job tests it")
    return Admission(min(wait, PROBE_LOOK_S),
                     f"{breaker.provider} {refused or 'was unavailable'}; waiting for one test job to get through")


async def start_probe(conn: asyncpg.Connection, provider: str, job_id: str) -> None:
    """Half open the breaker with `job_id` as its one probe, for a lease of PROBE_LEASE_S."""
    await conn.execute(
        f"""
        UPDATE provider_breakers SET state = {sql(BreakerState.HALF_OPEN)}, probe_job_id = $2,
            reopen_at = clock_timestamp() + make_interval(secs => $3)
        WHERE provider = $1
        """,
        provider, job_id, PROBE_LEASE_S,
    )


# $2: close it even if it is closed already (an operator's reset); otherwise only a breaker with something to
# forget is written. Returns the closed row and the state it was in.
_CLOSE = f"""
UPDATE provider_breakers b SET state = {SQL_CLOSED}, failures = 0, probe_job_id = NULL, cooldown_s = 0,
    reopen_at = NULL, cause = NULL
FROM (SELECT provider, state FROM provider_breakers WHERE provider = $1) AS was
WHERE b.provider = was.provider AND ($2 OR b.state <> {SQL_CLOSED} OR b.failures <> 0)
RETURNING b.*, was.state AS was
"""


async def _close(conn: asyncpg.Connection, provider: str, *, always: bool) -> Breaker | None:
    """Close the breaker and, if it was holding jobs back, hand the provider's free slots to the jobs it
    parked. The closed breaker, or None if there was nothing to write."""
    row = await conn.fetchrow(_CLOSE, provider, always)
    if row is None:
        return None
    fields = dict(row)
    if always or fields.pop("was") != BreakerState.CLOSED:
        await outbox.add(conn, await waiting.slot_wakeup(conn, provider))
    return msgspec.convert(fields, Breaker)


async def reset(conn: asyncpg.Connection, provider: str) -> Breaker | None:
    """Close the provider's breaker as a successful answer would, and hand a render slot to the next job
    waiting for it now rather than when its deferred message comes back. None if it never had one."""
    return await _close(conn, provider, always=True)


async def record_answer(
    conn: asyncpg.Connection, provider: str, code: ErrorCode | None, settings: Settings,
) -> BreakerState:
    """Feed the breaker with how the provider answered a submission (None: it accepted); its state after.
    Call under the provider's lock."""
    if code is None or (code not in FAILURES and code not in REFUSALS):
        # Any other answer, even a refusal of this one request, shows the provider is up and takes our calls.
        await _close(conn, provider, always=False)
        return BreakerState.CLOSED
    row = await conn.fetchrow(
        """
        INSERT INTO provider_breakers AS b (provider, failures) VALUES ($1, 1)
        ON CONFLICT (provider) DO UPDATE SET failures = b.failures + 1
        RETURNING state, failures, cooldown_s
        """,
        provider,
    )
    assert row is not None  # an upsert returns its row
    probe_failed = row["state"] == BreakerState.HALF_OPEN
    # An outage may pass by itself, so it takes several in a row; a refusal is every call's answer until an
    # operator acts, so the first one opens it.
    if code not in REFUSALS and not probe_failed and row["failures"] < settings.breaker_threshold:
        return BreakerState(row["state"])
    cooldown = min(row["cooldown_s"] * 2 if probe_failed else settings.breaker_cooldown_s, MAX_COOLDOWN_S)
    await conn.execute(
        f"""
        UPDATE provider_breakers SET state = {sql(BreakerState.OPEN)}, opened_at = clock_timestamp(),
            probe_job_id = NULL, reopen_at = clock_timestamp() + make_interval(secs => $2), cooldown_s = $2,
            cause = $3
        WHERE provider = $1
        """,
        provider, max(cooldown, settings.breaker_cooldown_s), code.value,
    )
    return BreakerState.OPEN
