"""Job statuses, the stages people see, and the legal moves between statuses (DESIGN.md "Job states")."""

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
    CANCELED = "canceled"  # the owner canceled it
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
    S.PENDING: frozenset({S.SUBMITTED, S.RETRYING, S.FAILED, S.CANCELED}),
    S.SUBMITTED: frozenset({S.PROCESSING, S.DOWNLOADING, S.RETRYING, S.FAILED, S.CANCELED}),
    S.PROCESSING: frozenset({S.DOWNLOADING, S.RETRYING, S.FAILED, S.CANCELED}),
    S.RETRYING: frozenset({S.PENDING, S.CANCELED}),
    S.DOWNLOADING: frozenset({S.COMPLETED, S.FAILED, S.CANCELED}),
    S.COMPLETED: frozenset({S.EXPIRED}),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
    S.EXPIRED: frozenset(),
}

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


def is_legal(from_status: JobStatus | None, to_status: JobStatus) -> bool:
    """`None` stands for creation, which always starts at pending."""
    if from_status is None:
        return to_status is S.PENDING
    return to_status in LEGAL[from_status]


def sources_of(to_status: JobStatus) -> frozenset[JobStatus]:
    """Every status from which `to_status` may be reached."""
    return frozenset(s for s, targets in LEGAL.items() if to_status in targets)
