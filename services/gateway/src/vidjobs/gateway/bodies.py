"""Request and response bodies of the public API (docs/API.md), as msgspec Structs.

Requests forbid unknown fields, so a typo is answered with 422 naming it instead of being ignored. The
OpenAPI document is generated from these same Structs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from vidjobs.common.credits import LedgerKind
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.states import JobStatus, Stage
from vidjobs.providers.base import Format

MAX_PROMPT_CHARS = 2000

Model = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]*/[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=128,
                            description="`<provider>/<model name>`", examples=["fake/default"])]
# `\S` (searched, not matched): a prompt of only spaces is as empty as no prompt.
Prompt = Annotated[str, Meta(min_length=1, max_length=MAX_PROMPT_CHARS, pattern=r"\S",
                             examples=["a red fox in snow"])]
UploadId = Annotated[str, Meta(pattern=r"^upl_[0-9a-z]{1,64}$", description="an id from POST /v1/uploads")]
AppEvent = Literal["job.completed", "job.failed", "job.canceled", "job.stage", "job.moved", "job.retrying",
                   "job.expiring"]
DEFAULT_JOB_EVENTS = ["job.completed", "job.failed", "job.canceled"]
WebhookUrl = Annotated[str, Meta(min_length=1, max_length=2048, description="an https URL of your app",
                                  examples=["https://app.example/hooks/vidjobs"])]
MAX_METADATA_KEYS = 16
MetadataKey = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.-]{1,40}$")]
Metadata = Annotated[dict[MetadataKey, Annotated[str, Meta(max_length=256)]], Meta(
    max_length=MAX_METADATA_KEYS,
    description="your own labels: up to 16 keys of 1-40 letters, digits, `_`, `.` or `-`, each a string of at "
                "most 256 characters; returned with the job and filterable in GET /v1/jobs")]
AspectRatio = Literal["16:9", "9:16", "1:1"]
Resolution = Literal["480p", "720p", "1080p"]
MAX_FALLBACKS = 3
MAX_WAIT_LIMIT_S = 7 * 86400
Fallbacks = Annotated[list[Model], Meta(
    max_length=MAX_FALLBACKS,
    description="models to move to, in order, while the job waits: when its provider is unavailable, or its "
                "estimated start is later than max_wait_s; each must render this request at no more than its quote")]
# The job's lane in its account's queue (vidjobs.common.jobs.Lane): the names of Lane's members.
Priority = Literal["interactive", "batch"]
ImageType = Literal["image/png", "image/jpeg", "image/webp"]  # the images an upload may be


class CreateJob(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/jobs`."""

    model: Model  # `<provider>/<model>` or a model alias; GET /v1/models lists them
    prompt: Prompt  # what to render
    # seconds of video, 1-60 (a model may round up to a length it makes)
    duration_s: Annotated[int, Meta(ge=1, le=60)] = 5
    aspect_ratio: AspectRatio = "16:9"  # 16:9, 9:16 or 1:1
    resolution: Resolution = "720p"  # 480p, 720p or 1080p
    # the same seed and request render alike, where the model takes one
    seed: Annotated[int, Meta(ge=0, le=2**32 - 1)] | None = None
    # what not to render, where the model takes one
    negative_prompt: Annotated[str, Meta(max_length=MAX_PROMPT_CHARS)] | None = None
    input_image: UploadId | None = None  # an upload id (POST /v1/uploads): render from this first frame
    params: dict[str, Any] = {}  # the provider's own extras, checked by its adapter
    metadata: Metadata = {}  # your own labels: returned with the job and filterable
    # an URL of your app that hears of this job, signed with your webhook secret (POST /v1/account/webhook-secret)
    webhook_url: WebhookUrl | None = None
    # which events go to webhook_url; default job.completed, job.failed, job.canceled
    webhook_events: Annotated[list[AppEvent], Meta(min_length=1)] | None = None
    # where it may move while it waits, up to 3; unset: the account's default list (GET /v1/account); []: none
    fallback_models: Fallbacks | None = None
    # the longest it should wait for a slot: past it (by the estimate), it moves to a fallback that starts sooner
    max_wait_s: Annotated[int, Meta(ge=1, le=MAX_WAIT_LIMIT_S)] | None = None
    # default interactive; batch starts after your waiting interactive jobs (other accounts' turns are unchanged)
    priority: Priority = "interactive"

    def to_request(self) -> JobRequest:
        """What the provider is asked for; metadata, webhooks, where it may move and the lane are ours alone."""
        fields = msgspec.to_builtins(self)
        for own in ("metadata", "webhook_url", "webhook_events", "fallback_models", "max_wait_s", "priority"):
            del fields[own]
        return msgspec.convert(fields, JobRequest)


class JobOutputs(msgspec.Struct, kw_only=True):
    video_url: str | None  # null once the job expired: the original was removed
    thumbnail_url: str  # a JPEG poster frame; signed and expiring
    preview_url: str | None  # a short low-resolution clip of its start; null once expired
    expires_at: datetime  # when these links stop working; read the job again for fresh ones
    # when the original is removed (the job becomes `expired`; warned `job.expiring` before); null while kept
    retained_until: datetime | None
    kept: bool  # kept past retention (POST /v1/jobs/{id}/keep) until released (DELETE /v1/jobs/{id}/keep)
    duration_s: float  # of the stored video
    width: int  # of the stored video, in pixels
    height: int  # of the stored video, in pixels
    bytes: int  # of the stored video
    sha256: str  # of the stored video, hex
    thumbnail_width: int | None  # pixels
    thumbnail_height: int | None  # pixels
    preview_width: int | None  # pixels
    preview_height: int | None  # pixels
    preview_duration_s: float | None  # seconds of the low-resolution preview clip


class Cost(msgspec.Struct, kw_only=True):
    estimated_credits: int  # reserved when the job was created, and the most it can cost
    actual_credits: int | None  # charged when it ended; null until then
    provider_credits: int | None  # what the provider billed for all its attempts, in credits; null: not known yet
    absorbed_credits: int | None  # once it ended: what of provider_credits the platform paid, not you; else null


class JobUrls(msgspec.Struct, kw_only=True):
    """Where to read, cancel and follow the job."""

    get: str  # this job
    cancel: str  # POST here to cancel it
    stream: str  # its Server-Sent Events


class QueueEstimate(msgspec.Struct, kw_only=True):
    """When a waiting job is likely to start and be ready: a range from the typical case (p50) to a late one
    (p90), made from the renders of its model this deployment measured and its provider's queue as it stands.
    The times are null when there is no estimate (too few renders measured yet, submissions paused, the
    provider unavailable): `unavailable` names why, `note` says it in words."""

    jobs_ahead: int  # jobs likely to start before it at its provider, every account's
    jobs_ahead_p90: int  # as many as may start before it in the late case
    start_p50: datetime | None  # likely start; a moment in the past means any moment now
    start_p90: datetime | None  # late start
    ready_p50: datetime | None  # likely ready
    ready_p90: datetime | None  # late ready
    # why there are no times: too_few_renders, submissions_paused or provider_unavailable; null when there are
    unavailable: Literal["too_few_renders", "submissions_paused", "provider_unavailable"] | None
    note: str  # in words: what the times rest on, or why there are none


class ReadyEstimate(msgspec.Struct, kw_only=True):
    """When a job at its provider (submitted or processing) is likely to be ready: its start plus how long its
    model's renders measured here took from start to ready, from the typical case (p50) to a late one (p90).
    The times are null when there is no range (too few renders measured yet, or it has passed the late end
    already): `unavailable` names why, `note` says it in words. `deadline_at` is when it is stopped."""

    ready_p50: datetime | None  # likely ready; a moment in the past means any moment now
    ready_p90: datetime | None  # late ready
    unavailable: Literal["too_few_renders", "overdue"] | None  # why there are no times; null when there are
    note: str  # in words: what the times rest on, or why there are none


class RetryOut(msgspec.Struct, kw_only=True):
    """Why a job was sent round again: what ended its last try (while `retrying`, the attempt it shows; then
    the try before the one at hand; a rate limit waits without spending an attempt). Its stage stays where it
    had got to."""

    code: ErrorCode  # what ended the last try: rate_limited, provider_unavailable, timeout, ...
    message: str  # what happened, in words
    max_attempts: int  # the most attempts it may have


class JobOut(msgspec.Struct, kw_only=True):
    """A job as every read shows it: where it stands, what was asked for, and when things happened."""

    id: str  # job_...
    status: JobStatus  # where it is in its lifecycle
    # what a person is shown: it only moves forward (a retry keeps it; `attempt` and `retry` say it is one)
    stage: Stage  # only moves forward: queued, submitted, rendering, downloading, ready; or failed, canceled, expired
    model: str  # the model it renders with (an alias resolved)
    prompt: str  # as asked
    created_at: datetime  # when it was created
    updated_at: datetime  # when anything about it last changed
    attempt: int  # which render attempt (a transient failure is retried as a new one)
    retry: RetryOut | None  # once retried: what ended the last try, and how many attempts it may have; else null
    # its place among the account's waiting jobs while it waits (interactive before batch), or in the provider's queue
    queue_position: int | None
    queue_reason: str | None  # why a queued job is not submitted yet (a paused or busy provider)
    priority: Priority  # its lane: the account's waiting interactive jobs are numbered and started before batch ones
    estimate: QueueEstimate | None  # while it waits (pending): when it is likely to start and be ready; else null
    ready: ReadyEstimate | None  # while at its provider (submitted, processing): when it is likely ready; else null
    progress: float | None  # the provider's own progress figure, 0-1, where it gives one
    error: JobError | None  # why it failed; null unless it did
    outputs: JobOutputs | None  # the stored render; null until it is ready
    cost: Cost  # credits reserved and charged
    # The request as it was accepted (an alias resolved in `model`).
    duration_s: int  # as asked
    aspect_ratio: str  # as asked
    resolution: str  # as asked
    seed: int | None  # as asked
    negative_prompt: str | None  # as asked
    input_image: str | None  # as asked
    params: dict[str, Any]  # as asked
    metadata: dict[str, str]  # your labels, as given
    fallback_models: list[str]  # where it may still move while it waits, in order (its trail says where it moved)
    max_wait_s: int | None  # its limit on waiting for a slot, as asked
    started_at: datetime | None  # when the provider accepted its current attempt
    completed_at: datetime | None  # when it reached its ending: completed, failed or canceled
    deadline_at: datetime | None  # when its current stage gives up (a render's: from its model's measured renders)
    retry_at: datetime | None  # while retrying: when the next attempt is queued
    rerun_of: str | None  # the job it renders again (POST /v1/jobs/{id}/rerun); null for any other job
    urls: JobUrls  # where to read, cancel and follow it


class JobList(msgspec.Struct, kw_only=True):
    data: list[JobOut]  # newest first
    next_cursor: str | None  # pass as `cursor` for the next page; null on the last
    has_more: bool  # whether another page follows (then `next_cursor` fetches it)


class ListQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Query string of `GET /v1/jobs`. Besides these, `metadata.<key>=<value>` keeps the jobs whose metadata
    has that key with that value (several: all of them)."""

    status: Annotated[str, Meta(description="one status or several, comma-separated")] | None = None
    model: Model | None = None  # only jobs of this model
    created_after: datetime | None = None  # jobs created at or after this time
    created_before: datetime | None = None  # jobs created before this time
    limit: Annotated[int, Meta(ge=1, le=100)] = 20  # jobs per page, 1-100
    cursor: str | None = None  # next_cursor of the previous page


class TransitionOut(msgspec.Struct, kw_only=True):
    from_: JobStatus | None = msgspec.field(name="from")  # None for creation
    to: JobStatus  # the status it moved to
    stage: Stage  # the stage shown after the move: it never goes back, a retry keeps it
    at: datetime  # when
    reason: str  # why, in words


class Trail(msgspec.Struct, kw_only=True):
    data: list[TransitionOut]  # oldest first


class Credits(msgspec.Struct, kw_only=True):
    balance: int  # credits the account holds
    reserved: int  # held for jobs that have not finished
    available: int  # balance - reserved: what new jobs may use


class Limits(msgspec.Struct, kw_only=True):
    """The limits in force: the account's own, or the platform's where it has none."""

    concurrent_jobs: int  # renders at once; more jobs wait in the account's queue
    daily_spend_cap: int | None  # credits committed per UTC day; null: no cap
    max_job_credits: int | None  # the most one job may be estimated at; null: no maximum
    requests_per_s: float  # API requests per second, per API key
    request_burst: int  # requests one key may make at once after a quiet spell
    max_queued_jobs: int  # jobs that may wait for a slot at once; creating more answers 429
    max_open_streams: int  # event streams open at once (per gateway replica)
    max_open_streams_per_key: int  # event streams open at once per API key (per gateway replica)
    max_uploads_per_day: int  # image uploads per UTC day, deleted ones included
    max_body_bytes: int  # a JSON request body
    max_upload_bytes: int  # an uploaded image
    max_webhook_endpoints: int  # webhook endpoints registered at once
    webhook_deliveries_in_flight: int  # webhook attempts under way at once; more wait their turn
    webhook_deliveries_per_minute: int  # webhook attempts a minute; more wait their turn
    max_webhook_manual_retries: int  # times one delivery may be sent again by hand
    max_exports_in_flight: int  # exports pending at once (POST /v1/jobs/{id}/export); more answer 429


class StorageOut(msgspec.Struct, kw_only=True):
    """What the account's kept clips hold (POST /v1/jobs/{id}/keep), against its storage quota."""

    used_bytes: int  # the stored videos of its kept jobs
    limit_bytes: int  # the most they may hold; a keep that would pass it answers 409 storage_quota_exceeded
    kept_jobs: int  # jobs kept past retention


class AccountOut(msgspec.Struct, kw_only=True):
    """Answer of `GET /v1/account`."""

    id: str  # acct_...
    name: str  # the account's name
    credits: Credits  # balance, reserved and available
    limits: Limits  # the limits in force
    spent_today: int  # credits committed today (UTC), as the daily cap counts them
    active_jobs: int  # jobs not finished yet, waiting ones included
    queued_jobs: int  # of those, waiting for a slot
    uploads_today: int  # image uploads made today (UTC), as the daily cap counts them
    fallback_models: list[str]  # the default for a job that names none (PATCH /v1/account)
    storage: StorageOut  # what kept clips hold, and the most they may


class AccountPatch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PATCH /v1/account`: the settings an account keeps for itself; unset fields stay as they are."""

    fallback_models: Fallbacks | None = None  # the default for a job that names none; [] for none


class LedgerQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Query string of `GET /v1/account/ledger`."""

    limit: Annotated[int, Meta(ge=1, le=100)] = 20  # entries per page, 1-100
    cursor: str | None = None  # next_cursor of the previous page


class LedgerEntryOut(msgspec.Struct, kw_only=True):
    """One change of the account's balance or reservation, and what it left."""

    id: int  # its place in the ledger
    kind: LedgerKind  # what changed the balance or reservation
    job_id: str | None  # the job it concerns, if any
    balance_change: int  # credits
    reserved_change: int  # credits
    balance_after: int  # credits
    reserved_after: int  # credits
    note: str  # why, in words
    at: datetime  # when
    absorbed: int  # credits the provider billed beyond the job's charge, paid by the platform (absorb entries)


class LedgerPage(msgspec.Struct, kw_only=True):
    data: list[LedgerEntryOut]  # newest first
    next_cursor: str | None  # pass as `cursor` for the next page; null on the last


MAX_USAGE_RANGE_DAYS = 366
UsageGrouping = Annotated[str, Meta(
    pattern=r"^(model|day|metadata\.[A-Za-z0-9_.-]{1,40})$",
    description="model, day (UTC; the default) or metadata.<key> (a key of 1-40 letters, digits, `_`, `.` or `-`)",
    examples=["model", "day", "metadata.customer"])]


class UsageQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Query string of `GET /v1/account/usage`: the jobs created in [from, to), at most 366 days."""

    group_by: UsageGrouping = "day"  # model, day (UTC) or metadata.<key>; default day
    # jobs created at or after this ISO-8601 time, with its offset; default 30 days before `to`
    from_: Annotated[datetime, Meta(tz=True)] | None = msgspec.field(default=None, name="from")
    to: Annotated[datetime, Meta(tz=True)] | None = None  # jobs created before this ISO-8601 time; default now


class UsageGroup(msgspec.Struct, kw_only=True):
    """The account's jobs of one model, UTC day or metadata value, created in the range."""

    # the model, the day (YYYY-MM-DD) or the metadata value; null: the jobs that do not have the metadata key
    key: str | None
    jobs: int  # jobs created in the range (deleted ones left out)
    by_status: dict[str, int]  # of those, how many are in each status now
    credits_charged: int  # what the jobs that ended were charged
    credits_reserved: int  # estimates still held for the jobs that have not ended
    seconds_delivered: float  # seconds of video of the jobs completed (and since expired), as stored


class UsageReport(msgspec.Struct, kw_only=True):
    """Answer of `GET /v1/account/usage`."""

    group_by: str  # as asked
    from_: datetime = msgspec.field(name="from")  # the range's start, as used
    to: datetime  # the range's end (not included), as used
    data: list[UsageGroup]  # in key order; jobs without the metadata key last
    truncated: bool  # true when there were more than 1000 groups and only the first 1000 are here


class WebhookAck(msgspec.Struct, kw_only=True):
    received: bool  # the callback was taken
    duplicate: bool  # this delivery was stored before
    # False for a callback that names no render of ours: acknowledged, so the sender stops, and dropped.
    stored: bool = True


class Health(msgspec.Struct, kw_only=True):
    status: str  # ok, or why not


UploadState = Literal["processing", "ready", "rejected"]
UploadRefusal = Literal["image_corrupt", "image_too_large", "image_unsupported", "image_empty", "image_unprocessed"]


class UploadErrorOut(msgspec.Struct, kw_only=True):
    code: UploadRefusal  # why the image was rejected
    message: str  # the same, in words


class UploadOut(msgspec.Struct, kw_only=True):
    """An upload (`POST /v1/uploads`, `GET /v1/uploads/{id}`). It is `processing` until the media worker has
    decoded it; then `ready`, its image stored upright and stripped of metadata, or `rejected`."""

    id: Annotated[str, Meta(description="name it as a job's `input_image` once `status` is `ready`")]
    # processing: decoding has not finished; ready: a job may name it; rejected: `error` says why
    status: UploadState
    width: int  # pixels: upright once ready; while processing, as the header declares them
    height: int  # pixels
    content_type: ImageType  # as sniffed from the bytes
    bytes: int  # of the stored (re-encoded) image once ready; while processing, of the image as received
    error: UploadErrorOut | None = None  # why it was rejected; null unless it was


class ModelOut(msgspec.Struct, kw_only=True):
    """A model this deployment renders with: what it takes, and its price by resolution."""

    id: str  # what a job's `model` names
    provider: str  # the provider it renders at
    aliases: list[str]  # model aliases that send some of their accounts here (rollout routing)
    durations_s: list[int]  # the clip lengths it renders
    rounds_up: bool  # a length under the longest that is not listed is rendered as the next one listed
    formats: list[Format]  # the (aspect ratio, resolution) pairs it renders
    formats_with_image: list[Format] | None  # the pairs it renders from an input image, where they differ
    input_image: str  # none | optional | required
    negative_prompt: bool  # whether it takes one
    seed: bool  # whether it takes one
    credits_per_second: dict[str, float | None]  # resolution -> price on the current rate card (null: unpriced)


class ModelList(msgspec.Struct, kw_only=True):
    data: list[ModelOut]  # every model, by provider
    rate_card_version: int  # the card the prices come from


class EstimateOut(msgspec.Struct, kw_only=True):
    """What `POST /v1/jobs` with this body would reserve, without creating anything."""

    model: str  # the model it would render with (an alias resolved, as a create by this account would now)
    estimated_credits: int  # what a create would reserve
    credits_per_second: float  # the price
    rate_card_version: int  # the card the price comes from
    available_credits: int  # the account's balance less what running jobs have reserved
    affordable: bool  # whether a create would be accepted as far as credit goes (daily caps aside)


class EndpointIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/webhook-endpoints`."""

    url: WebhookUrl  # an https URL of your app
    # which events it hears; default all seven
    events: Annotated[list[AppEvent], Meta(min_length=1)] = msgspec.field(
        default_factory=lambda: ["job.completed", "job.failed", "job.canceled", "job.stage", "job.moved",
                                 "job.retrying", "job.expiring"])
    description: Annotated[str, Meta(max_length=200)] = ""  # your own note


class EndpointOut(msgspec.Struct, kw_only=True):
    id: str  # whe_...
    url: str  # where deliveries go
    events: list[str]  # which events it hears
    description: str  # your own note
    created_at: datetime  # when it was registered
    disabled_at: datetime | None  # it answered 410 Gone; nothing more is sent to it
    disabled_reason: str | None  # why it was disabled
    secret_created_at: datetime  # when its secret was made: at registration, or by its last rotation
    # until then deliveries are signed with the secret its last rotation replaced too; null: only the current
    previous_secret_expires_at: datetime | None


class EndpointCreated(EndpointOut, kw_only=True):
    secret: str  # whsec_...: verifies its deliveries (Standard Webhooks); shown this once


class EndpointList(msgspec.Struct, kw_only=True):
    data: list[EndpointOut]  # oldest first


class AttemptOut(msgspec.Struct, kw_only=True):
    at: datetime  # when it was sent
    status: int | None  # the HTTP status your endpoint answered; null when it did not answer
    error: str | None  # what went wrong when no answer came
    ms: int  # how long the attempt took


class DeliveryOut(msgspec.Struct, kw_only=True):
    id: str  # its webhook-id header: the same on every attempt
    job_id: str  # the job it tells of
    event_type: str  # job.completed, job.failed, job.canceled, job.stage, job.moved, job.retrying or job.expiring
    # pending (more attempts to come), delivered, failed (schedule used up) or disabled (410)
    status: Literal["pending", "delivered", "failed", "disabled"]
    next_attempt_at: datetime | None  # when it is tried next, while pending
    created_at: datetime  # when the move happened
    attempt_count: int  # attempts made so far
    attempts: list[AttemptOut]  # the last ten attempts, oldest first


class DeliveryQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Query string of `GET /v1/webhook-endpoints/{endpoint_id}/deliveries`."""

    limit: Annotated[int, Meta(ge=1, le=100)] = 20  # deliveries per page, 1-100
    cursor: str | None = None  # next_cursor of the previous page


class DeliveryList(msgspec.Struct, kw_only=True):
    data: list[DeliveryOut]  # newest first
    next_cursor: str | None = None  # pass as `cursor` for the next page; null on the last


DEFAULT_OVERLAP_S = 86_400
MAX_OVERLAP_S = 7 * 86_400


class RotateSecretIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret` and `POST /v1/account/webhook-secret`."""

    # seconds the replaced secret keeps signing beside the new one: 0 (not at all) to 604800 (7 days); default a day
    overlap_s: Annotated[int, Meta(ge=0, le=MAX_OVERLAP_S)] = DEFAULT_OVERLAP_S


class SecretIssued(msgspec.Struct, kw_only=True):
    secret: str  # whsec_...: verifies deliveries from now on (Standard Webhooks); shown this once
    created_at: datetime  # when it was made
    # until then deliveries are signed with the secret it replaced too (two `v1,` signatures); null: not at all
    previous_secret_expires_at: datetime | None


class WebhookSecretOut(msgspec.Struct, kw_only=True):
    """The account's secret for the webhook_url a job names, described; the secret is shown only when made."""

    created_at: datetime | None  # when it was made; null: none yet (POST /v1/account/webhook-secret makes it)
    # until then deliveries are signed with the secret the last rotation replaced too; null: only the current
    previous_secret_expires_at: datetime | None


MAX_EXPORT_URL_CHARS = 4096


class ExportIn(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/jobs/{job_id}/export`."""

    # a presigned PUT URL of your own bucket (https); the clip is PUT there as it is stored
    url: Annotated[str, Meta(min_length=1, max_length=MAX_EXPORT_URL_CHARS,
                             description="a presigned PUT URL of your own bucket, https, at most 4096 characters",
                             examples=["https://my-bucket.s3.amazonaws.com/clips/fox.mp4?X-Amz-Signature=..."])]


class ExportOut(msgspec.Struct, kw_only=True):
    """An export of a job's stored original to a URL of yours."""

    id: str  # exp_...
    job_id: str  # the job whose clip it copies
    host: str  # where it goes (the URL itself is a credential of yours and is not shown)
    status: Literal["pending", "done", "failed"]  # pending until the copy is stored there, or given up
    reason: str | None  # failed: why; pending: what the last try met, when one failed (it is tried again)
    attempts: int  # tries that failed so far
    bytes: int | None  # sent, once done
    created_at: datetime  # when it was asked for
    finished_at: datetime | None  # when it was done or given up


class ExportList(msgspec.Struct, kw_only=True):
    data: list[ExportOut]  # newest first, the last 20
