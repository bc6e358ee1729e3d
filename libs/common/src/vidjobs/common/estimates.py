"""When will a waiting job start, and when will it be ready? A range (p50 to p90) from what this deployment
measured of the model's renders and the provider's queue as it stands, or, in plain words, why there is none.

The model is simple on purpose, and every part of it is written out here:

- What renders take. Of the model's jobs completed in the last `estimate_window_s` (at most the last
  `estimate_samples`): how long each held its provider slot (`submitted_at` to `rendered_at`, when its render
  left the provider) and how long it took from start to ready (`submitted_at` to `completed_at`, the copy and
  the thumbnails included); p50 and p90 of each. With fewer than `estimate_min_samples` there is no estimate.
- Who goes first. A provider hands its slots out round robin across accounts, each account's oldest job
  first (submitter/dispatch.py). A job k-th among its account's jobs waiting at its provider has its own k-1
  ahead, and of every other account with n jobs waiting there min(n, k-1) (p50: they take their turns first)
  to min(n, k) (p90: their k-th may go before it too).
- When slots free. The provider renders `concurrency` at once (VIDJOBS_PROVIDER_LIMITS). A render in flight
  lets go of its slot once the typical hold (p50; p90 for the late case) has passed since it started, at
  once if it is overdue; from then on each slot turns over once per hold. The job starts as the slot after
  the jobs ahead of it comes free, and no sooner than the provider's rate cap lets that many through.
- Its account's cap bounds it the same way: its own k-1 ahead through the account's `concurrent_jobs` slots
  and its renders in flight. The start is the later of the two.
- Ready is start plus the model's time from start to ready (p50, p90). Times are rounded outwards, p50 down
  and p90 up: to the second within a minute, 5 s within ten, a minute within the hour, 5 minutes within six
  hours, else 15.

Left out: renders that fail and go round again, the account's jobs waiting at other providers, the fair
order's preference for the account with fewer renders in flight, other models sharing the provider (their
renders are taken to hold a slot as long as this model's), and the moment between a render letting go of its
slot and the next one taking it (the wake-up through the outbox, well under a second). No times while the
platform switch pauses submissions or the provider's breaker holds it back: nobody can say when that ends.

What it reads, and how often: a provider's queue (every account's count of jobs waiting there, in ONE grouped
query, with each of those accounts' cap and renders in flight; the provider's own renders in flight; the
switch and the breaker) and a model's measurements are each read at most once per `estimate_refresh_s` per
process, whoever asks: every read of a waiting job and every open event stream share them, so a backlog of
100,000 jobs costs one read per provider and interval, not one per job. A job's own place at its provider
(`place_sql`, read with the job) is the only part read per job.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate
from typing import Literal, TypeVar

import asyncpg
import msgspec

from vidjobs.common import breakers, metrics, switch
from vidjobs.common.jobs import JobRow
from vidjobs.common.measurements import Measured, read_measured
from vidjobs.common.settings import ProviderLimits, Settings
from vidjobs.common.states import SQL_PENDING, SQL_RENDERING, JobStatus

Conn = asyncpg.Connection | asyncpg.Pool
T = TypeVar("T")

# Why a waiting job has no times (its `note` says it in words).
Unavailable = Literal["too_few_renders", "submissions_paused", "provider_unavailable"]

# Cache entries kept before the expired ones are dropped (accounts come and go; providers and models do not).
_MAX_ENTRIES = 4096


class Estimate(msgspec.Struct, frozen=True, kw_only=True):
    """Where a waiting job stands at its provider, and when it is likely to start and be ready."""

    jobs_ahead: int  # jobs likely to start before it at its provider, every account's (the p50 case)
    jobs_ahead_p90: int  # as many as may start before it (the late case)
    start_p50: datetime | None  # may lie a few seconds in the past: it may start any moment
    start_p90: datetime | None
    ready_p50: datetime | None
    ready_p90: datetime | None
    unavailable: Unavailable | None = None  # why there are no times; None when there are
    note: str  # in words: what the times rest on, or why there are none

    def times(self) -> tuple[datetime | None, ...]:
        return self.start_p50, self.start_p90, self.ready_p50, self.ready_p90


@dataclass(frozen=True)
class AccountLoad:
    cap: int  # renders it may have in flight at once, at every provider together
    rendering: tuple[datetime, ...]  # when each of its renders in flight started, oldest first

    def __post_init__(self) -> None:
        object.__setattr__(self, "rendering", tuple(sorted(self.rendering)))


class Backlog:
    """The jobs waiting at one provider, counted per account, kept so that how many go before a job costs a
    binary search however many accounts wait: Σ min(n_a, m) is the counts up to m plus m for each above."""

    def __init__(self, waiting: Mapping[str, int]) -> None:
        self.waiting = dict(waiting)
        self._counts = sorted(waiting.values())
        self._sums = list(accumulate(self._counts, initial=0))

    def _capped(self, m: int) -> int:
        """Σ over every account of min(its waiting jobs, m)."""
        below = bisect.bisect_right(self._counts, m)
        return self._sums[below] + m * (len(self._counts) - below)

    def ahead(self, account_id: str, place: int) -> tuple[int, int]:
        """(p50, p90) jobs going before the `place`-th (1 is first) waiting job of `account_id`: its own
        place - 1, and of every other account min(n, place - 1) to min(n, place)."""
        own = self.waiting.get(account_id, 0)
        before = place - 1
        likely = before + self._capped(before) - min(own, before)
        late = before + self._capped(place) - min(own, place)
        return likely, late


@dataclass(frozen=True)
class ProviderQueue:
    """One provider's queue as read at one moment (see the module docstring for what and how often)."""

    backlog: Backlog
    accounts: dict[str, AccountLoad]  # of the accounts with a job waiting there
    rendering: tuple[datetime, ...]  # when each of its renders in flight started, oldest first
    paused: str | None = None  # why the platform switch pauses every submission, if it does
    held: str | None = None  # why the provider's breaker holds its jobs back, if it does

    def __post_init__(self) -> None:
        # Oldest first is soonest done first: an estimate then reads the one render whose end it needs
        # (slot_free_at) instead of sorting them all, once per waiting job and refresh.
        object.__setattr__(self, "rendering", tuple(sorted(self.rendering)))


# ---- SQL --------------------------------------------------------------------------------------------------

def places_sql(account: str, *, provider: str | None = None, through: str | None = None) -> str:
    """SQL for (id, place) of the account's waiting jobs, numbered from 1 within each provider in the order that
    provider hands out their slots: the one definition of a job's place at its provider. `provider` keeps one
    provider's; `through` (a jobs alias) keeps those up to that job. Read from jobs_provider_waiting (one
    provider) or jobs_account_waiting (all of them), from the front."""
    kept = [f"w.account_id = {account}", f"w.status = {SQL_PENDING}", "w.deleted_at IS NULL"]
    if provider is not None:
        kept.append(f"w.provider = {provider}")
    if through is not None:
        kept.append(f"(w.lane, w.created_at, w.id) <= ({through}.lane, {through}.created_at, {through}.id)")
    return f"""SELECT w.id,
               row_number() OVER (PARTITION BY w.provider ORDER BY w.lane, w.created_at, w.id) AS place
        FROM jobs w WHERE {" AND ".join(kept)}"""


def place_sql(job: str) -> str:
    """SQL for the place (1 is next) of the waiting job `job` (a jobs alias) among its account's jobs waiting at
    its provider; its cost is that place."""
    ahead = places_sql(f"{job}.account_id", provider=f"{job}.provider", through=job)
    return f"(SELECT count(*) FROM ({ahead}) AS ahead)"


# Every account with a job waiting at the provider: how many, its cap, and when its renders in flight (at any
# provider) started. One grouped pass over jobs_provider_waiting, then one probe of jobs_account_rendering per
# account. Only `id` and `concurrent_jobs` of accounts, which the submitter's role may read.
_WAITING = f"""
SELECT w.account_id, w.waiting, a.concurrent_jobs AS cap,
       ARRAY(SELECT COALESCE(r.submitted_at, r.updated_at) FROM jobs r
             WHERE r.account_id = w.account_id AND r.status IN {SQL_RENDERING} AND r.deleted_at IS NULL) AS rendering
FROM (SELECT account_id, count(*) AS waiting FROM jobs
      WHERE provider = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
      GROUP BY account_id) AS w
JOIN accounts a ON a.id = w.account_id
"""

# The provider's renders in flight (jobs_provider_active), the platform switch, and the breaker when it holds
# the provider's jobs back (open with its pause running, or half open with a test job out).
_PROVIDER = f"""
SELECT ARRAY(SELECT COALESCE(j.submitted_at, j.updated_at) FROM jobs j
             WHERE j.provider = $1 AND j.status IN {SQL_RENDERING} AND j.deleted_at IS NULL) AS rendering,
       c.paused, c.reason, b.state AS breaker, b.reopen_at
FROM platform_controls c
LEFT JOIN provider_breakers b ON b.provider = $1 AND {breakers.pausing_sql('b')}
WHERE c.name = $2
"""

_ACCOUNT = f"""
SELECT a.concurrent_jobs AS cap,
       ARRAY(SELECT COALESCE(r.submitted_at, r.updated_at) FROM jobs r
             WHERE r.account_id = a.id AND r.status IN {SQL_RENDERING} AND r.deleted_at IS NULL) AS rendering
FROM accounts a WHERE a.id = $1
"""

async def place_at_provider(conn: Conn, job: JobRow) -> int:
    """The waiting job's place among its account's jobs waiting at its provider (1 is next)."""
    return await conn.fetchval(f"SELECT {place_sql('j')} FROM jobs j WHERE j.id = $1", job.id) or 1


async def read_queue(conn: Conn, provider: str) -> ProviderQueue:
    rows = await conn.fetch(_WAITING, provider)
    state = await conn.fetchrow(_PROVIDER, provider, switch.SUBMISSIONS)
    paused = None
    if state is not None and state["paused"]:
        paused = "new submissions are paused for the whole platform" + (f": {state['reason']}" if state["reason"]
                                                                        else "")
    return ProviderQueue(
        backlog=Backlog({r["account_id"]: r["waiting"] for r in rows}),
        accounts={r["account_id"]: AccountLoad(r["cap"], tuple(r["rendering"])) for r in rows},
        rendering=tuple(state["rendering"]) if state is not None else (),
        paused=paused, held=_held(provider, state),
    )


def _held(provider: str, state: asyncpg.Record | None) -> str | None:
    if state is None or state["breaker"] is None:
        return None
    if state["breaker"] == breakers.BreakerState.OPEN:
        return (f"{provider} is unavailable; submissions to it are paused until {state['reopen_at']:%H:%M:%S} UTC, "
                "then one job tests it")
    return f"{provider} was unavailable; waiting for one test job to get through"


async def read_account(conn: Conn, account_id: str) -> AccountLoad:
    row = await conn.fetchrow(_ACCOUNT, account_id)
    # An account that is gone has no jobs to estimate; one slot keeps the arithmetic defined.
    return AccountLoad(1, ()) if row is None else AccountLoad(row["cap"], tuple(row["rendering"]))


# ---- the arithmetic ----------------------------------------------------------------------------------------

def slot_free_in(remaining: Sequence[float], slots: int, nth: int, hold_s: float) -> float:
    """Seconds until the `nth` slot handed out (0: the first) comes free, of `slots` slots whose renders in
    flight let go after `remaining` seconds each, and then turn over once every `hold_s`. More in flight than
    slots (a cap lowered): the first of them to finish only bring the count down to the cap."""
    busy = sorted(remaining)[-slots:] if len(remaining) > slots else sorted(remaining)
    idle = slots - len(busy)
    turn, i = divmod(nth, slots)
    return (0.0 if i < idle else busy[i - idle]) + turn * hold_s


def slot_free_at(started: Sequence[datetime], slots: int, nth: int, hold_s: float, now: datetime) -> float:
    """`slot_free_in` for renders in flight that started at `started`, oldest first (so soonest done first):
    the one render whose end the answer needs is found by its index, whatever the number in flight."""
    busy = min(len(started), slots)
    idle = slots - busy
    turn, i = divmod(nth, slots)
    if i < idle:
        return turn * hold_s
    at = started[len(started) - busy + i - idle]
    return max(0.0, hold_s - (now - at).total_seconds()) + turn * hold_s


def start_in(*, ahead: int, own_ahead: int, hold_s: float, now: datetime, queue: ProviderQueue,
             account: AccountLoad, limits: ProviderLimits) -> tuple[float, bool]:
    """(seconds until the job starts, whether its account's cap is what holds it): the later of its provider's
    slot after `ahead` jobs, its account's slot after `own_ahead`, and the rate cap letting `ahead` through."""
    at_provider = slot_free_at(queue.rendering, max(1, limits.concurrency), ahead, hold_s, now)
    at_account = slot_free_at(account.rendering, max(1, account.cap), own_ahead, hold_s, now)
    paced = ahead / limits.rate_per_s if limits.rate_per_s > 0 else 0.0
    return max(at_provider, at_account, paced), at_account > max(at_provider, paced)


def step_s(offset_s: float) -> int:
    """How finely a time this far away is told: to the second within a minute, then 5 s within ten, a minute
    within the hour, 5 minutes within six hours, then 15."""
    for within, step in ((60, 1), (600, 5), (3600, 60), (6 * 3600, 300)):
        if offset_s < within:
            return step
    return 900


def rounded(now: datetime, offset_s: float, *, up: bool) -> datetime:
    """`now + offset_s` on its step's grid, rounded down (p50) or up (p90): the same time reads the same on
    every read until it really moves."""
    step = step_s(offset_s)
    at = now.timestamp() + offset_s
    return datetime.fromtimestamp((math.ceil(at / step) if up else math.floor(at / step)) * step, UTC)


def span(seconds: float) -> str:
    """A duration in words: `45 s`, `4 min`, `2.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h".replace(".0 h", " h")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class Inputs:
    """Everything one estimate is made from."""

    model: str
    place: int  # among its account's jobs waiting at its provider
    account_id: str
    account: AccountLoad
    queue: ProviderQueue
    measured: Measured
    limits: ProviderLimits
    settings: Settings
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def _none(inputs: Inputs, ahead: tuple[int, int], why: Unavailable, note: str) -> Estimate:
    return Estimate(jobs_ahead=ahead[0], jobs_ahead_p90=ahead[1], start_p50=None, start_p90=None, ready_p50=None,
                    ready_p90=None, unavailable=why, note=note)


def estimate(inputs: Inputs) -> Estimate:
    """The estimate the module docstring describes, from what was read."""
    ahead = inputs.queue.backlog.ahead(inputs.account_id, inputs.place)
    measured, settings = inputs.measured, inputs.settings
    if inputs.queue.paused is not None:
        return _none(inputs, ahead, "submissions_paused", inputs.queue.paused)
    if inputs.queue.held is not None:
        return _none(inputs, ahead, "provider_unavailable", inputs.queue.held)
    if measured.samples < settings.estimate_min_samples:
        have = f"only {_plural(measured.samples, 'render')}" if measured.samples else "no renders"
        return _none(inputs, ahead, "too_few_renders",
                     f"{have} of {inputs.model} measured here in the last {span(settings.estimate_window_s)}; "
                     f"an estimate needs {settings.estimate_min_samples}")
    likely, _ = _start(inputs, ahead[0], measured.hold_p50_s)
    late, capped = _start(inputs, ahead[1], measured.hold_p90_s)
    late = max(late, likely)
    now = inputs.now
    return Estimate(
        jobs_ahead=ahead[0], jobs_ahead_p90=ahead[1],
        start_p50=rounded(now, likely, up=False), start_p90=rounded(now, late, up=True),
        ready_p50=rounded(now, likely + measured.ready_p50_s, up=False),
        ready_p90=rounded(now, late + max(measured.ready_p90_s, measured.ready_p50_s), up=True),
        note=_basis(inputs, capped))


def _start(inputs: Inputs, ahead: int, hold_s: float) -> tuple[float, bool]:
    return start_in(ahead=ahead, own_ahead=inputs.place - 1, hold_s=hold_s, now=inputs.now, queue=inputs.queue,
                    account=inputs.account, limits=inputs.limits)


def _basis(inputs: Inputs, capped: bool) -> str:
    m, provider = inputs.measured, inputs.model.split("/", 1)[0]
    said = (f"from the last {_plural(m.samples, 'render')} of {inputs.model} measured here "
            f"({span(m.ready_p50_s)} to {span(max(m.ready_p90_s, m.ready_p50_s))} from start to ready) "
            f"and {provider} rendering {inputs.limits.concurrency} at once")
    if capped:
        said += f"; your account's limit of {inputs.account.cap} at once is what holds it"
    return said


def moved(old: Estimate | None, new: Estimate | None, now: datetime) -> bool:
    """Whether `new` tells a person something `old` did not: a job ahead gone, times appearing or going, or a
    time that moved by more than the rounding at its distance (a time that only crossed a rounding boundary
    did not)."""
    if old is None or new is None:
        return old is not new
    if (old.jobs_ahead, old.jobs_ahead_p90, old.unavailable) != (new.jobs_ahead, new.jobs_ahead_p90, new.unavailable):
        return True
    return times_moved(zip(old.times(), new.times(), strict=True), now)


def times_moved(pairs: Iterable[tuple[datetime | None, datetime | None]], now: datetime) -> bool:
    """Whether any (was, is now) time appeared, went, or moved by more than the rounding at its distance."""
    for was, is_now in pairs:
        if was is None or is_now is None:
            if was is not is_now:
                return True
            continue
        if abs((is_now - was).total_seconds()) > step_s(max(0.0, (is_now - now).total_seconds())):
            return True
    return False


# ---- shared reads ------------------------------------------------------------------------------------------

class Estimator:
    """Estimates for waiting jobs, from reads shared by everyone in the process: one per provider (its queue),
    per model (its measurements) and per account missing from its provider's read, each at most once per
    `estimate_refresh_s`. Concurrent askers of a stale entry wait for the one read rather than each making
    it. Use one per process (the gateway's, the submitter's)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._cached: dict[tuple[str, str], tuple[float, object]] = {}
        self._reading: dict[tuple[str, str], asyncio.Lock] = {}

    async def for_job(self, conn: Conn, job: JobRow, place: int | None = None) -> Estimate | None:
        """The estimate of a waiting job (None for a job that does not wait). `place`: its place at its
        provider (`place_sql`), when it was read with the job; otherwise it is read here."""
        if job.status is not JobStatus.PENDING or job.deleted_at is not None:
            return None
        if place is None:
            place = await place_at_provider(conn, job)
        return await self._estimate(conn, job.model, job.account_id, place, waiting_there=True)

    async def for_joining(self, conn: Conn, model: str, account_id: str) -> Estimate:
        """Where a new job of `model` from the account would start and be ready if it joined the queue now."""
        queue = await self.queue(conn, model.split("/", 1)[0])
        place = queue.backlog.waiting.get(account_id, 0) + 1
        return await self._estimate(conn, model, account_id, place, waiting_there=False)

    async def _estimate(self, conn: Conn, model: str, account_id: str, place: int, *, waiting_there: bool,
                        ) -> Estimate:
        provider = model.split("/", 1)[0]
        queue = await self.queue(conn, provider)
        measured = await self.measured(conn, model)
        account = queue.accounts.get(account_id) if waiting_there else None
        if account is None:
            account = await self._fresh("account", account_id, lambda: read_account(conn, account_id))
        return estimate(Inputs(model=model, place=place, account_id=account_id, account=account, queue=queue,
                               measured=measured, limits=self._settings.limits_for(provider),
                               settings=self._settings))

    async def measured(self, conn: Conn, model: str) -> Measured:
        """The model's renders measured here, read at most once per refresh interval."""
        return await self._fresh("model", model, lambda: read_measured(conn, model, self._settings))

    async def queue(self, conn: Conn, provider: str) -> ProviderQueue:
        return await self._fresh("provider", provider, lambda: read_queue(conn, provider))

    async def _fresh(self, kind: str, key: str, read: Callable[[], Awaitable[T]]) -> T:
        entry = (kind, key)
        if (hit := self._hit(entry)) is not None:
            return hit  # type: ignore[return-value]
        lock = self._reading.setdefault(entry, asyncio.Lock())
        async with lock:
            # Read by whoever held the lock before us: theirs is as fresh as ours would be.
            if (hit := self._hit(entry)) is not None:
                return hit  # type: ignore[return-value]
            value = await read()
            metrics.ESTIMATE_READS.labels(kind).inc()
            self._keep(entry, value)
            return value

    def _hit(self, entry: tuple[str, str]) -> object | None:
        found = self._cached.get(entry)
        return found[1] if found is not None and found[0] > self._clock() else None

    def _keep(self, entry: tuple[str, str], value: object) -> None:
        now = self._clock()
        if len(self._cached) >= _MAX_ENTRIES:
            for stale in [k for k, (until, _) in self._cached.items() if until <= now]:
                del self._cached[stale]
                if (lock := self._reading.get(stale)) is not None and not lock.locked():
                    del self._reading[stale]
        self._cached[entry] = (now + self._settings.estimate_refresh_s, value)
