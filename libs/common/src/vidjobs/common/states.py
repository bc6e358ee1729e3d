"""Job statuses, the stages people see, and the legal moves between statuses (docs/ARCHITECTURE.md "Job states")."""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    PENDING = "pending"  # waiting for a submission slot
    SUBMITTED = "submitted"  # the provider accepted the request
    PROCESSING = "processing"  # the provider reported progress
    RETRYING = "retrying"  # a transient failure; waiting out the backoff
    DOWNLOADING = "downloading"  # the render is done; copying it into our storage
    COMPLETED = "completed"  # stored, verified, thumbnailed
    FAILED = "failed"  # gave up; `error` says why
    CANCELED = "canceled"  # the owner canceled it (or deleted it while it was live)
    EXPIRED = "expired"  # retention passed; the original was removed


class Stage(enum.StrEnum):
    QUEUED = "queued"
    SUBMITTED = "submitted"
    RENDERING = "rendering"
    DOWNLOADING = "downloading"
    READY = "ready"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"


S = JobStatus

TERMINAL: frozenset[JobStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELED, S.EXPIRED})
NON_TERMINAL: frozenset[JobStatus] = frozenset(set(S) - TERMINAL)
# At the provider: the job holds one of its provider's render slots, and one of its account's.
RENDERING: frozenset[JobStatus] = frozenset({S.SUBMITTED, S.PROCESSING})

# from -> the statuses it may move to. `canceled` is reachable from every non-terminal status.
LEGAL: dict[JobStatus, frozenset[JobStatus]] = {
    # pending -> pending: a waiting job moved to one of its fallback models (vidjobs.submitter.failover)
    S.PENDING: frozenset({S.PENDING, S.SUBMITTED, S.RETRYING, S.FAILED, S.CANCELED}),
    S.SUBMITTED: frozenset({S.PROCESSING, S.DOWNLOADING, S.RETRYING, S.FAILED, S.CANCELED}),
    S.PROCESSING: frozenset({S.DOWNLOADING, S.RETRYING, S.FAILED, S.CANCELED}),
    S.RETRYING: frozenset({S.PENDING, S.CANCELED}),
    S.DOWNLOADING: frozenset({S.COMPLETED, S.FAILED, S.CANCELED}),
    S.COMPLETED: frozenset({S.EXPIRED}),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
    S.EXPIRED: frozenset(),
}

# The endings that settle a job's credit (expiry comes after completion, which already did).
def sql(statuses: JobStatus | frozenset[JobStatus]) -> str:
    """Statuses written into SQL text: `'pending'`, or `('submitted', 'processing')`.

    Constants rather than `$n` parameters where a partial index serves the query: PostgreSQL uses a partial
    index (jobs_account_waiting: `WHERE status = 'pending'`) only when the query's own predicate implies the
    index's, which a parameter in a generic plan never does. Spelled from the enum, so a status has one
    spelling in the code."""
    if isinstance(statuses, JobStatus):
        return f"'{statuses.value}'"
    return "(" + ", ".join(f"'{s.value}'" for s in JobStatus if s in statuses) + ")"


SQL_PENDING = sql(S.PENDING)
SQL_RENDERING = sql(RENDERING)
SQL_TERMINAL = sql(TERMINAL)


BILLED_ENDINGS: frozenset[JobStatus] = frozenset({S.COMPLETED, S.FAILED, S.CANCELED})


class FollowUp(enum.StrEnum):
    """What a move does beyond the row, in the same transaction (`transitions` carries each out). Every move
    also appends its audit row and, once committed, sends a change hint; these are the ones that depend on
    the move."""

    SETTLE_CREDIT = "settle_credit"  # release the reservation, charge what the job owes, write the ledger
    FREE_SLOT = "free_slot"  # it left the provider: wake the next job waiting for that render slot
    ROUTE_OUTCOME = "route_outcome"  # it ended: count the outcome and duration on its route's metrics
    TELL_APPS = "tell_apps"  # its stage may change, it ended or is retried: its account's webhooks hear of it


def _follow_ups(src: JobStatus, to: JobStatus) -> frozenset[FollowUp]:
    out = set()
    if to in BILLED_ENDINGS and src not in TERMINAL:
        out.add(FollowUp.SETTLE_CREDIT)
    if src in RENDERING and to not in RENDERING:
        out.add(FollowUp.FREE_SLOT)
    if to in TERMINAL and src not in TERMINAL:
        out.add(FollowUp.ROUTE_OUTCOME)
    if app_events(src, to):
        out.add(FollowUp.TELL_APPS)
    return frozenset(out)


# What an account's app may subscribe to (webhook endpoints, a job's own webhook_url).
# `job.expiring` is no move: the reaper sends it before retention removes a clip (vidjobs.reaper.retention).
APP_EVENT_TYPES = ("job.completed", "job.failed", "job.canceled", "job.stage", "job.moved", "job.retrying",
                   "job.expiring")
EXPIRING_EVENT = "job.expiring"
_ENDING_EVENTS = {S.COMPLETED: "job.completed", S.FAILED: "job.failed", S.CANCELED: "job.canceled"}


def app_events(src: JobStatus, to: JobStatus, *, stage_moved: bool | None = None) -> list[str]:
    """The app events a move makes: `job.stage` when the stage people see moves on (`stage_moved`, which the
    move itself finds out, since it depends on the stage the job had reached: None asks whether it can), its
    ending's own, `job.retrying` when a transient failure sends it round again (its stage stays), and
    `job.moved` when a waiting job moves to a fallback model (the one move from a status to itself)."""
    if src is to is S.PENDING:
        return ["job.moved"]
    if stage_moved is None:
        stage_moved = stage_may_move(src, to)
    out = ["job.stage"] if stage_moved else []
    if to is S.RETRYING:
        out.append("job.retrying")
    if (ending := _ENDING_EVENTS.get(to)) is not None and src not in TERMINAL:
        out.append(ending)
    return out


# Each status's own stage: what a job shows in it on its first pass. Once retried, a job shows the later of this
# and the stage it had reached (stage_after). Operators' figures (the stage clock `stage_at`, the time-in-stage
# metrics, the gauges) count by this one, so a render's time is not mixed with a retry's wait in the queue.
STAGE_OF: dict[JobStatus, Stage] = {
    S.PENDING: Stage.QUEUED,
    S.RETRYING: Stage.QUEUED,
    S.SUBMITTED: Stage.SUBMITTED,
    S.PROCESSING: Stage.RENDERING,
    S.DOWNLOADING: Stage.DOWNLOADING,
    S.COMPLETED: Stage.READY,
    S.FAILED: Stage.FAILED,
    S.CANCELED: Stage.CANCELED,
    S.EXPIRED: Stage.EXPIRED,
}

# The order people see the stages in: each is reached after the ones before it. The endings come last (a job
# fails or is canceled from any stage), and expiry after being ready.
STAGE_ORDER: dict[Stage, int] = {
    Stage.QUEUED: 0, Stage.SUBMITTED: 1, Stage.RENDERING: 2, Stage.DOWNLOADING: 3,
    Stage.READY: 4, Stage.FAILED: 4, Stage.CANCELED: 4, Stage.EXPIRED: 5,
}


def stage_after(reached: Stage | None, status: JobStatus) -> Stage:
    """The stage a job shows in `status`, having reached `reached` before (None: nothing yet, or not known).

    A stage only moves forward. A retry sends a job back through the queue for a new attempt, but it keeps
    the stage it had reached: it is still working towards its render, and its `attempt` and `retry` say that
    this is another go and why. An ending shows itself, whatever came before."""
    own = STAGE_OF[status]
    if status in TERMINAL or reached is None or STAGE_ORDER[own] >= STAGE_ORDER[reached]:
        return own
    return reached


def stage_may_move(src: JobStatus, to: JobStatus) -> bool:
    """Whether a move from `src` to `to` can change the stage people see, whatever the job had reached: an
    ending always does; any other move only towards a later stage than `src`'s own (then it does unless the
    job had reached that stage before)."""
    if to in TERMINAL:
        return STAGE_OF[to] is not STAGE_OF[src]
    return STAGE_ORDER[STAGE_OF[to]] > STAGE_ORDER[STAGE_OF[src]]


# (from, to) -> what that move also does, for every legal move.
FOLLOW_UPS: dict[tuple[JobStatus, JobStatus], frozenset[FollowUp]] = {
    (src, to): _follow_ups(src, to) for src, targets in LEGAL.items() for to in targets
}


def is_legal(from_status: JobStatus | None, to_status: JobStatus) -> bool:
    """`None` stands for creation, which always starts at pending."""
    if from_status is None:
        return to_status is S.PENDING
    return to_status in LEGAL[from_status]


def sources_of(to_status: JobStatus) -> frozenset[JobStatus]:
    """Every status from which `to_status` may be reached."""
    return frozenset(s for s, targets in LEGAL.items() if to_status in targets)
