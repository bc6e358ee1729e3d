"""The jobs this gateway process's event streams follow: each read once per change, however many streams
follow it, and fanned out to them in memory.

A change hint (vidjobs.common.changes) on a job's subject marks its feed to be read again; a hint on an
account's queue subject marks the account's waiting feeds, which are read again together, in one query, with
any of its feeds that streams just opened and that were never read. A feed a stream just opened is read with
the account's other new ones, and alone if the queue has not moved: a queue k deep opened stream by stream
costs k job reads, not k²/2.
Reads of one feed (or one account's queue) are coalesced: one runs at once, at most one every
`stream_coalesce_s`, and one more after the last hint, so a burst of changes costs a read or two and every
follower still ends on the latest state. A stream waiting for its first event waits for the read running, not
for the interval: at a launch, an account's streams open as fast as its reads answer. The reads run on a
pool of their own (`stream_db_pool_size`), so streams never queue for the connections API requests use, and
with no request's deadline: a slow read delays what the streams show, it does not end them, and a failed one
is tried again.

A waiting job's estimate and a rendering job's ready range move with time and with other accounts' queues,
which no hint announces: every `estimate_refresh_s` one task remakes them for every feed that has one from
the reads the whole process shares (vidjobs.common.estimates), reading no job, and wakes the streams whose
job's estimate moved. It gives the event loop back every `REFRESH_SLICE` jobs, and with thousands followed
it spaces its passes so that it takes at most `REFRESH_SHARE` of the process's time. A stream has no timer
of its own beyond its keepalive.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import Counter

from vidjobs.common import estimates, events, faults, render_estimates, waits
from vidjobs.common.states import RENDERING, TERMINAL, JobStatus
from vidjobs.gateway.tenant import OwnedJob, Tenant

log = logging.getLogger("vidjobs.gateway.feeds")

FEED_READS = Counter("vidjobs_stream_reads_total",
                     "Reads of followed jobs for event streams: one job (`job`), or an account's (`account`)",
                     ["kind"])

_RETRY_S = (0.5, 1.0, 2.0, 5.0)  # after a failed read: a stalled or restarting database
# Estimates remade between two turns of the event loop. Each is made from the process's shared reads, with
# nothing to wait for, so a pass over 10,000 followed jobs would otherwise hold every request and stream of
# the process for the whole pass (over a second on a busy 2-core machine); a slice is a few milliseconds.
REFRESH_SLICE = 64
# The share of the process's time the refresh may take: with many jobs followed, passes are spaced further
# apart than `estimate_refresh_s` (estimates a few seconds older), rather than the refresh taking the core
# that requests and streams need. A pass over 10,000 jobs took about a second of a busy gateway's time.
REFRESH_SHARE = 0.1


@dataclass(eq=False)
class Feed:
    """One job followed in this process: the latest read of it, and the streams following it."""

    job_id: str
    account_id: str
    latest: OwnedJob | None = None
    # What the followers were last woken for: a change is judged against it, so estimates that drift a little
    # at each refresh cannot add up unseen.
    announced: OwnedJob | None = None
    read_once: asyncio.Event = field(default_factory=asyncio.Event)  # set once a first read answered
    gone: bool = False  # read as deleted (or never the account's): nothing more will change
    followers: set[asyncio.Event] = field(default_factory=set)

    def publish(self, job: OwnedJob | None) -> None:
        self.latest, self.gone = job, job is None
        first = not self.read_once.is_set()
        self.read_once.set()
        if first or job is None or self.announced is None or moved(self.announced, job):
            self.announced = job
            for woken in self.followers:
                woken.set()

    @property
    def waiting(self) -> bool:
        return self.latest is not None and self.latest.job.status is JobStatus.PENDING

    @property
    def finished(self) -> bool:
        return self.gone or (self.latest is not None and self.latest.job.status in TERMINAL)


def shown(job: OwnedJob) -> tuple[object, ...]:
    """What the job's JSON shows, its estimates aside: every stored change moves `updated_at`, and the queue
    position is made at read time. The signed URLs are left out: they are new at every read, which is not a
    change."""
    return job.job.status, job.job.updated_at, job.waiting_position


def moved(before: OwnedJob, after: OwnedJob) -> bool:
    """Whether `after` shows something `before` did not; an estimate that only drifted within its rounding is
    not news."""
    now = datetime.now(UTC)
    return (shown(before) != shown(after) or estimates.moved(before.estimate, after.estimate, now)
            or render_estimates.moved(before.ready, after.ready, now))


def _estimated(status: JobStatus) -> bool:
    """Whether a job in `status` carries an estimate made afresh from the shared reads (a waiting or a
    rendering job's)."""
    return status is JobStatus.PENDING or status in RENDERING


class _Coalesced:
    """Runs a key's read after a hint: at once if none runs, else once more when the running one ends, and
    never more often than once per `gap_s`, unless marked `now` (a stream waiting for its first event: that
    read waits for the one running, not for the gap). The read runs in a task of its own, outside any
    request's context (so no request's database deadline applies to it)."""

    def __init__(self, gap_s: float, read: Callable[[str], Awaitable[None]]) -> None:
        self._gap_s, self._read = gap_s, read
        self._due: set[str] = set()
        self._hurry: dict[str, asyncio.Event] = {}  # set: a read marked `now` is due
        self._running: dict[str, asyncio.Task[None]] = {}

    def mark(self, key: str, *, now: bool = False) -> None:
        self._due.add(key)
        if key not in self._running:
            loop = asyncio.get_running_loop()
            self._hurry[key] = asyncio.Event()
            self._running[key] = loop.create_task(self._run(key), context=contextvars.Context())
        if now:
            self._hurry[key].set()

    async def _run(self, key: str) -> None:
        loop, failures, hurry = asyncio.get_running_loop(), 0, self._hurry[key]
        try:
            while key in self._due:
                self._due.discard(key)
                hurry.clear()
                started = loop.time()
                try:
                    await self._read(key)
                    failures = 0
                except faults.INFRASTRUCTURE as exc:
                    self._due.add(key)  # read again: the streams wait for it, they do not end
                    log.warning("followed job unreadable; reading again", extra={"key": key, "error": repr(exc)})
                    await asyncio.sleep(_RETRY_S[min(failures, len(_RETRY_S) - 1)])
                    failures += 1
                    continue
                await waits.set_within(hurry, max(0.0, self._gap_s - (loop.time() - started)))
        finally:
            self._running.pop(key, None)
            self._hurry.pop(key, None)

    async def close(self) -> None:
        self._due.clear()
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)


class Feeds:
    """Every job this process's streams follow (one Feed each) and the reads that keep them current."""

    def __init__(self, nc: NATS, pool: asyncpg.Pool, tenant_of: Callable[[str], Tenant], *, gap_s: float,
                 refresh_s: float) -> None:
        self._nc, self._pool, self._tenant_of = nc, pool, tenant_of
        self._refresh_s = refresh_s
        self._feeds: dict[str, Feed] = {}
        self._by_account: dict[str, set[Feed]] = {}
        self._subscriptions: list[Subscription] = []
        self._jobs = _Coalesced(gap_s, self._read_job)
        self._accounts = _Coalesced(gap_s, self._read_account)
        self._queue_moved: set[str] = set()  # accounts whose waiting feeds are due a read (their places moved)

    async def start(self) -> None:
        """Hear every job's and every queue's hints, once for the process: a hint names its job (or account) in
        its subject, and one about nothing followed here is dropped at a dict lookup. Two subscriptions in
        all, rather than one per followed job, each with a task and a queue of its own."""
        jobs, queues = f"{events.CHANGED_PREFIX}.", f"{events.QUEUE_PREFIX}."

        async def on_job(msg: Msg) -> None:
            job_id = msg.subject[len(jobs):]
            if job_id in self._feeds:
                self._jobs.mark(job_id)

        async def on_queue(msg: Msg) -> None:
            account_id = msg.subject[len(queues):]
            if account_id in self._by_account:
                self._queue_moved.add(account_id)
                self._accounts.mark(account_id)

        self._subscriptions = [await self._nc.subscribe(f"{jobs}*", cb=on_job),
                               await self._nc.subscribe(f"{queues}*", cb=on_queue)]

    @contextlib.asynccontextmanager
    async def follow(self, account_id: str, job_id: str, woken: asyncio.Event) -> AsyncIterator[Feed]:
        """The job's feed while the block runs, `woken` set whenever it shows something new. The first
        follower in the process reads it (the hints are heard already, so a change during that read is not
        missed); later ones share what is read."""
        feed = self._feeds.get(job_id)
        if feed is None:
            feed = Feed(job_id, account_id)
            self._feeds[job_id] = feed
            self._by_account.setdefault(account_id, set()).add(feed)
            # Read with the account's other new feeds: a burst of streams opening (a page of jobs, a launch)
            # costs a query per account and read, not one per stream, and waits for no interval.
            self._accounts.mark(account_id, now=True)
        elif feed.account_id != account_id:
            feed = Feed(job_id, account_id)  # another account's job: for this one, no such job
            feed.publish(None)
        feed.followers.add(woken)
        try:
            yield feed
        finally:
            feed.followers.discard(woken)
            if not feed.followers and self._feeds.get(job_id) is feed:
                self._forget(feed)

    def followed(self) -> set[str]:
        """The jobs this process's streams follow now."""
        return set(self._feeds)

    def _forget(self, feed: Feed) -> None:
        del self._feeds[feed.job_id]
        mates = self._by_account.get(feed.account_id, set())
        mates.discard(feed)
        if not mates:
            self._by_account.pop(feed.account_id, None)
            self._queue_moved.discard(feed.account_id)

    async def _read_job(self, job_id: str) -> None:
        feed = self._feeds.get(job_id)
        if feed is None:
            return  # nobody follows it any more
        FEED_READS.labels("job").inc()
        feed.publish(await self._tenant_of(feed.account_id).job(job_id, conn=self._pool))

    async def _read_account(self, account_id: str) -> None:
        """Every job of the account followed here that was never read (a stream just opened on it) and, when
        its queue moved, every one that waits (their places moved together), read at once. A stream opening
        alone does not reread the waiting ones: a queue k deep opening k streams costs k reads, not k²."""
        queue_moved = account_id in self._queue_moved
        self._queue_moved.discard(account_id)
        wanted = {f.job_id: f for f in self._by_account.get(account_id, set())
                  if (queue_moved and f.waiting) or not f.read_once.is_set()}
        if not wanted:
            return
        FEED_READS.labels("account").inc()
        try:
            read = await self._tenant_of(account_id).followed_jobs(list(wanted), conn=self._pool)
        except BaseException:
            if queue_moved:
                self._queue_moved.add(account_id)  # the read is tried again, for the waiting ones too
            raise
        for job_id, feed in wanted.items():
            feed.publish(read.get(job_id))

    async def refresh(self, stop: asyncio.Event) -> None:
        """Remake every followed job's estimate (or ready range) from the shared reads, once per interval, or
        less often when a pass takes more than `REFRESH_SHARE` of the process's time."""
        pause_s = self._refresh_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause_s):
                    await stop.wait()
            spent_s = await self._refresh_pass()
            pause_s = max(self._refresh_s, spent_s / REFRESH_SHARE - spent_s)

    async def _refresh_pass(self) -> float:
        """One pass over the followed jobs, giving the loop back every `REFRESH_SLICE` of them: the seconds the
        pass itself ran (its slices), not counting what ran between them."""
        loop = asyncio.get_running_loop()
        spent_s, began = 0.0, loop.time()
        for n, feed in enumerate(list(self._feeds.values()), 1):
            if n % REFRESH_SLICE == 0:
                spent_s += loop.time() - began
                await asyncio.sleep(0)
                began = loop.time()
            if feed.latest is None or not _estimated(feed.latest.job.status) or not feed.followers:
                continue
            try:
                feed.publish(await self._tenant_of(feed.account_id).estimated(feed.latest, conn=self._pool))
            except faults.INFRASTRUCTURE as exc:
                log.warning("estimates not remade; next interval", extra={"error": repr(exc)})
                break
        return spent_s + loop.time() - began

    def wake_all(self) -> None:
        """Every stream looks up now (the gateway is shutting down: they end)."""
        for feed in self._feeds.values():
            for woken in feed.followers:
                woken.set()

    async def close(self) -> None:
        self.wake_all()
        for sub in self._subscriptions:
            with contextlib.suppress(nats.errors.Error):  # dropped already, or by a closed connection
                await sub.unsubscribe()
        await self._jobs.close()
        await self._accounts.close()
