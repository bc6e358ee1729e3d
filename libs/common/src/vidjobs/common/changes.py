"""Job change hints: "job X changed, look again", sent on core NATS once the transaction that changed the job
has committed, to whoever is listening (an open event stream subscribes to its job's subject).

A hint is not a source of truth: a listener rereads the job, and rereads on a timer besides, so a hint lost
to a crash between commit and send costs a listener a few seconds of staleness and nothing else. That is why
hints do not go through the outbox and JetStream: five durable, fsynced writes per job bought nothing, and a
core NATS publish that no stream listens for is dropped by the server before it costs anything more.

Sending after commit, not before: a listener woken before the commit would reread the old row and then wait
for its timer. Every transaction that may change a job runs inside `after_commit()` (`Runtime.tx` does it,
and `transition` does it for a bare connection); hints noted inside it are sent when the outermost one exits
without an error, and dropped when it rolls back.

The same boundary serves what must count only committed work: `on_commit` registers a callback (a metric
observation of a move) that runs when the hints are sent, and never for a transaction rolled back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime

from nats.aio.client import Client as NATS

from vidjobs.common import events, metrics
from vidjobs.common.events import Hint, JobChanged, QueueMoved

log = logging.getLogger("vidjobs.changes")



@dataclass
class _Pending:
    hints: list[Hint] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)


_pending: ContextVar[_Pending | None] = ContextVar("vidjobs_pending_changes", default=None)
_nc: NATS | None = None


def install(nc: NATS | None) -> None:
    """Send this process's hints through `nc` (None: drop them, as a process with no listeners may)."""
    global _nc
    _nc = nc


def uninstall(nc: NATS) -> None:
    """`nc` is closing: stop sending through it (unless another connection has been installed since)."""
    global _nc
    if _nc is nc:
        _nc = None


def note(job_id: str, status: str, at: datetime) -> None:
    """Record that `job_id` changed, to be sent when the enclosing `after_commit()` commits. Outside one, the
    hint is dropped with a warning: the caller's transaction has no commit this module can see."""
    pending = _pending.get()
    if pending is None:
        log.warning("job change noted outside after_commit(); no hint sent", extra={"job_id": job_id})
        return
    pending.hints.append(JobChanged(job_id=job_id, status=status, at=at))


def note_queue(account_id: str) -> None:
    """Record that a job of `account_id` left its queue, or joined it ahead of jobs of a later lane, so the
    places of the jobs behind it moved: their event streams reread them on this one hint rather than each on
    a timer. Sent like `note`'s hints."""
    pending = _pending.get()
    if pending is None:
        log.warning("queue change noted outside after_commit(); no hint sent", extra={"account_id": account_id})
        return
    if QueueMoved(account_id=account_id) not in pending.hints:
        pending.hints.append(QueueMoved(account_id=account_id))


def on_commit(callback: Callable[[], None]) -> None:
    """Run `callback` once the enclosing `after_commit()` commits; never if it rolls back. Outside one there is
    commit this module can see, so it runs at once (`transition` always opens one, so its callbacks wait)."""
    pending = _pending.get()
    if pending is None:
        callback()
        return
    pending.callbacks.append(callback)


@contextlib.asynccontextmanager
async def after_commit() -> AsyncIterator[None]:
    """Enter before the transaction begins: hints noted inside are sent once it has committed. Nested uses
    join the outermost, which alone sends."""
    if _pending.get() is not None:
        yield
        return
    pending = _Pending()
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)
    for callback in pending.callbacks:
        try:
            callback()
        except Exception:
            # Bookkeeping after the fact must not turn a committed change into a failed handler.
            log.exception("an after-commit callback failed")
    await send(pending.hints)


async def send(hints: list[Hint]) -> None:
    nc = _nc
    if nc is None or not hints:
        return
    try:
        for hint in hints:
            await nc.publish(events.subject_for(hint), events.encode(hint))
    except Exception as exc:
        # Closed or draining: the listeners' timers cover it (see the module's docstring).
        log.warning("change hints not sent", extra={"error": repr(exc), "hints": len(hints)})
        metrics.CHANGE_HINTS_LOST.inc(len(hints))
