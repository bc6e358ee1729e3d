"""A live job's next recovery check (`recover_at`, and its RecoveryDue message): the reaper's look at a job
whose own messages may have been lost.

A rendering job's checks follow what is known of its render (docs/ARCHITECTURE.md "Recovery"): the first when
the render should be done, then closer together than `recovery_interval_s` while it is overdue, so a lost
callback is found soon after the render ends; a provider that is heard from once the render is past that moment
pushes the next check out, so a render whose callbacks keep arriving is not asked about, while a word before it
leaves the check at the render's expected end where it is (the last callback may still be lost); and none is
ever later than the render's deadline, where it is asked once more before it is timed out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from vidjobs.common import outbox
from vidjobs.common.events import RecoveryDue
from vidjobs.common.jobs import JobRow
from vidjobs.common.settings import Settings
from vidjobs.common.states import SQL_RENDERING, SQL_TERMINAL, TERMINAL


async def reschedule_recovery(conn: asyncpg.Connection, job_id: str, delay_s: float) -> datetime | None:
    """Push a live job's next recovery check out by `delay_s` and stage its message."""
    due: datetime | None = await conn.fetchval(
        f"""
        UPDATE jobs SET recover_at = clock_timestamp() + make_interval(secs => $2)
        WHERE id = $1 AND deleted_at IS NULL
          AND status NOT IN {SQL_TERMINAL}
        RETURNING recover_at
        """,
        job_id, delay_s,
    )
    if due is not None:
        await outbox.add(conn, [RecoveryDue(job_id=job_id, due_at=due)])
    return due


def render_check_in(job: JobRow, now: datetime, expected_s: float | None, settings: Settings) -> float:
    """Seconds to the next look at a rendering job nobody has heard from since `now`: when its render should be
    done (`expected_s` from submission, its model's median here; `recovery_delay_s` while unmeasured), then
    half its silence past that moment, kept between `recovery_taper_min_s` and `recovery_interval_s`."""
    expected_at = expected_end(job, expected_s, settings)
    if expected_at is None:
        return by_deadline(job, now, settings.recovery_interval_s)
    if now < expected_at:
        wait = (expected_at - now).total_seconds()
    else:
        overdue = (now - expected_at).total_seconds()
        wait = min(settings.recovery_interval_s, max(settings.recovery_taper_min_s, overdue / 2))
    return by_deadline(job, now, wait)


def expected_end(job: JobRow, expected_s: float | None, settings: Settings) -> datetime | None:
    """When a job's render should be done: `expected_s` (its model's median here; `recovery_delay_s` while
    unmeasured) from its submission; None before it is submitted."""
    if job.submitted_at is None:
        return None
    return job.submitted_at + timedelta(seconds=settings.recovery_delay_s if expected_s is None else expected_s)


def by_deadline(job: JobRow, now: datetime, wait_s: float) -> float:
    """`wait_s`, or less so as to look right at the job's deadline, so that it is acted on on time."""
    if job.deadline_at is None:
        return wait_s
    return min(wait_s, max((job.deadline_at - now).total_seconds(), 0.0) + 0.1)


async def first_render_check(conn: asyncpg.Connection, job: JobRow, expected_s: float | None,
                             settings: Settings) -> None:
    """A render just began (submitted, or adopted from a signal that beat the submitter): its first check."""
    if job.status not in TERMINAL:
        await reschedule_recovery(conn, job.id, render_check_in(job, datetime.now(UTC), expected_s, settings))


def check_after_word(job: JobRow, now: datetime, current: datetime | None, expected_s: float | None,
                     settings: Settings) -> datetime | None:
    """Where a rendering job's next check goes once its provider has spoken unasked at `now`, its check being at
    `current`; None: where it is. Never past the deadline.

    Before the render's expected end, the word says it started, not that its last callback will arrive: the
    check stays at that end (at least `recovery_taper_min_s` away if there was none), is pulled in to it from
    later, and is never moved later than it; a move under half `recovery_taper_min_s` is not written. Past it,
    the channel is known to work: `recovery_quiet_s` away, written only when that moves the check by more than
    half the quiet span, so a chatty provider costs one write per half span, not one per signal."""
    expected_at = expected_end(job, expected_s, settings)
    if expected_at is None or expected_at <= now:
        due = now + timedelta(seconds=by_deadline(job, now, settings.recovery_quiet_s))
        keep = current is not None and current >= due - timedelta(seconds=settings.recovery_quiet_s / 2)
        return None if keep else due
    ahead_s = max((expected_at - now).total_seconds(), settings.recovery_taper_min_s)
    due = now + timedelta(seconds=by_deadline(job, now, ahead_s))
    if current is None:
        return due
    due = min(due, max(current, expected_at))
    return None if abs((due - current).total_seconds()) <= settings.recovery_taper_min_s / 2 else due


async def heard_from(conn: asyncpg.Connection, job: JobRow, expected_s: float | None, settings: Settings) -> None:
    """The provider spoke of this render unasked (a callback, its poll schedule's answer): its next check moves
    as `check_after_word` says. `expected_s`: as for `render_check_in`. The row is held while that is decided,
    so a check the reaper schedules meanwhile is decided from, not overwritten blind."""
    row = await conn.fetchrow(
        f"""
        SELECT recover_at, clock_timestamp() AS now FROM jobs
        WHERE id = $1 AND deleted_at IS NULL AND status IN {SQL_RENDERING}
        FOR NO KEY UPDATE
        """,
        job.id,
    )
    if row is None:
        return
    due = check_after_word(job, row["now"], row["recover_at"], expected_s, settings)
    if due is None:
        return
    await conn.execute("UPDATE jobs SET recover_at = $2 WHERE id = $1", job.id, due)
    await outbox.add(conn, [RecoveryDue(job_id=job.id, due_at=due)])
