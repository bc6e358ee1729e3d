"""Events that travel between services, one tagged union per subject.

A message says what to look at, not what is true: every consumer rereads the row before acting. New fields
get defaults and existing field types never change, so an older consumer still reads a newer event.
"""

from __future__ import annotations

from datetime import datetime
from typing import get_args

import msgspec


class JobQueued(msgspec.Struct, tag="job.queued"):
    """A pending job wants a submission slot."""

    job_id: str


class SlotFreed(msgspec.Struct, tag="slot.freed"):
    """A render slot at `provider` came free: hand it to whoever is next, now rather than when a waiting
    job next looks."""

    provider: str


class InboxReceived(msgspec.Struct, tag="inbox.received"):
    """A verified provider callback was stored in the webhook inbox."""

    inbox_id: int
    provider: str


class PollRequested(msgspec.Struct, tag="poll.requested"):
    """Ask the provider about a job now (recovery, or a provider without callbacks)."""

    job_id: str
    reason: str = ""


class DownloadRequested(msgspec.Struct, tag="download.requested"):
    """The render is finished at the provider; copy it into our storage."""

    job_id: str


class AssetsDeleteRequested(msgspec.Struct, tag="assets.delete_requested"):
    """A job was deleted; remove its objects."""

    job_id: str


class ExportRequested(msgspec.Struct, tag="export.requested"):
    """The owner asked for a copy of the job's stored original at a URL of theirs (the `job_exports` row)."""

    export_id: str
    job_id: str


class CancelRequested(msgspec.Struct, tag="cancel.requested"):
    """We stopped caring about a render (canceled, deleted, past its deadline): ask the provider to stop."""

    job_id: str
    provider: str
    provider_job_id: str
    # The job's model without the provider prefix (`JobRequest.model_name`): a provider whose render ids do not
    # say where the render lives (fal) is asked under that model alone. Safe across a rolling upgrade: a message
    # from the previous release lacks it and decodes as None (the adapter then looks the render up as before),
    # and the previous release's consumer skips it as an unknown field (no event forbids those).
    model_name: str | None = None


class RecoveryDue(msgspec.Struct, tag="recovery.due"):
    """Look at a job at `due_at` in case its signals were lost."""

    job_id: str
    due_at: datetime


class AppEventDue(msgspec.Struct, tag="app_event.due"):
    """A job moved in a way its account's app may want to hear of: deliver it to the app's webhooks."""

    job_id: str
    types: list[str]  # what states.app_events names for the move (job.stage, job.retrying, ...), or job.expiring
    key: str  # names the move: each move is delivered once per event type and destination


class UploadReceived(msgspec.Struct, tag="upload.received"):
    """An uploaded image waits in quarantine: decode and clean it, then mark the upload ready or rejected."""

    upload_id: str


class JobChanged(msgspec.Struct, tag="job.changed"):
    """A job's status changed; progress displays reread the job."""

    job_id: str
    status: str
    at: datetime


class QueueMoved(msgspec.Struct, tag="queue.moved"):
    """A job of the account left its queue of waiting jobs: the places of those behind it moved up."""

    account_id: str


# Subjects. Work subjects are captured by the work stream and consumed by exactly one durable consumer
# each; change hints are core NATS messages to whoever listens (`changes`).
SUBMIT = "vidjobs.work.submit"
SUBMIT_DURABLE = "submitter"  # the submitter's consumer of SUBMIT (the reaper reads how far behind it is)
INBOX = "vidjobs.work.inbox"
POLL = "vidjobs.work.poll"
DOWNLOAD = "vidjobs.work.download"
ASSETS_DELETE = "vidjobs.work.assets_delete"
EXPORT = "vidjobs.work.export"
RECOVERY = "vidjobs.work.recovery"
CANCEL = "vidjobs.work.cancel"
APP_EVENTS = "vidjobs.work.app_events"
UPLOADS = "vidjobs.work.uploads"
CHANGED_PREFIX = "vidjobs.changed"
QUEUE_PREFIX = "vidjobs.queue"  # + account id: QueueMoved

# What each work subject carries: its consumer decodes these and nothing else, so an event on the wrong
# subject is a poison message at the door rather than an `assert` in a handler.
SubmitEvent = JobQueued | SlotFreed
# A value is an event class or a union of them (SubmitEvent): a form msgspec decodes to, not one `type`.
SUBJECT_EVENTS: dict[str, object] = {
    SUBMIT: SubmitEvent,
    INBOX: InboxReceived,
    POLL: PollRequested,
    DOWNLOAD: DownloadRequested,
    ASSETS_DELETE: AssetsDeleteRequested,
    EXPORT: ExportRequested,
    RECOVERY: RecoveryDue,
    CANCEL: CancelRequested,
    APP_EVENTS: AppEventDue,
    UPLOADS: UploadReceived,
}

WorkEvent = (
    JobQueued | SlotFreed | InboxReceived | PollRequested | DownloadRequested | AssetsDeleteRequested | RecoveryDue
    | CancelRequested | AppEventDue | ExportRequested | UploadReceived
)
Hint = JobChanged | QueueMoved  # core NATS, after commit (vidjobs.common.changes)
Event = WorkEvent | Hint

SUBJECT_OF: dict[type, str] = {
    kind: subject for subject, form in SUBJECT_EVENTS.items() for kind in get_args(form) or (form,)
    if isinstance(kind, type)
}


def tag_of(event: Event) -> str:
    """The event's name on the wire (its Struct tag)."""
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str), "every event above is tagged with a name"
    return tag


def subject_for(event: Event) -> str:
    if isinstance(event, JobChanged):
        return f"{CHANGED_PREFIX}.{event.job_id}"
    if isinstance(event, QueueMoved):
        return f"{QUEUE_PREFIX}.{event.account_id}"
    return SUBJECT_OF[type(event)]


_encoder = msgspec.json.Encoder()
_decoders: dict[str, msgspec.json.Decoder[WorkEvent]] = {
    subject: msgspec.json.Decoder(kind) for subject, kind in SUBJECT_EVENTS.items()
}
_change_decoder = msgspec.json.Decoder(JobChanged)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(subject: str, data: bytes) -> WorkEvent:
    """The event on work subject `subject`. Raises msgspec.DecodeError / ValidationError for a malformed
    message or one of a type that does not belong on the subject (a poison message), KeyError for a subject
    that is not a work subject."""
    return _decoders[subject].decode(data)


def decode_change(data: bytes) -> JobChanged:
    return _change_decoder.decode(data)
