"""The API's objects as typed values (msgspec Structs), decoded straight from its JSON answers.

Fields the API may add later are ignored rather than refused, so an older client keeps working against a newer
server. Statuses are plain strings for the same reason; `TERMINAL` names the ones a job never leaves.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict

import msgspec

TERMINAL = frozenset({"completed", "failed", "canceled", "expired"})
STAGES = ("queued", "submitted", "rendering", "downloading", "ready")


class _Model(msgspec.Struct):
    """Every model takes keyword arguments only (set on each class: msgspec does not inherit it)."""


class JobError(_Model, kw_only=True):
    code: str
    message: str
    retryable: bool = False


class Outputs(_Model, kw_only=True):
    video_url: str | None
    thumbnail_url: str
    preview_url: str | None = None
    expires_at: datetime
    retained_until: datetime | None = None  # null while kept
    kept: bool = False  # kept past retention until released
    duration_s: float
    width: int
    height: int
    bytes: int
    sha256: str
    thumbnail_width: int | None = None
    thumbnail_height: int | None = None
    preview_width: int | None = None
    preview_height: int | None = None
    preview_duration_s: float | None = None


class Cost(_Model, kw_only=True):
    estimated_credits: int
    actual_credits: int | None = None
    provider_credits: int | None = None  # what the provider billed for every attempt, in credits
    absorbed_credits: int | None = None  # once ended: what of that was not charged


class JobUrls(_Model, kw_only=True):
    get: str
    cancel: str
    stream: str


class QueueEstimate(_Model, kw_only=True):
    """When a waiting job is likely to start and be ready: from the typical case (p50) to a late one (p90).
    The times are None when there is no estimate; `note` says why (and otherwise what they rest on)."""

    jobs_ahead: int
    jobs_ahead_p90: int | None = None
    start_p50: datetime | None = None
    start_p90: datetime | None = None
    ready_p50: datetime | None = None
    ready_p90: datetime | None = None
    unavailable: str | None = None  # too_few_renders, submissions_paused, provider_unavailable
    note: str = ""

    def describe(self, now: datetime | None = None) -> str:
        """In words, for a person: "2–3 jobs ahead; starts in about 2–4 min, ready by 14:32–14:35" (local
        time), or "no estimate yet: <why>"."""
        now = now or datetime.now(UTC)
        most = self.jobs_ahead if self.jobs_ahead_p90 is None else max(self.jobs_ahead, self.jobs_ahead_p90)
        ahead = _range(self.jobs_ahead, most)
        ahead = f"{ahead} job{'' if most == 1 else 's'} ahead"
        start_p50, start_p90, ready_p50, ready_p90 = self.start_p50, self.start_p90, self.ready_p50, self.ready_p90
        if start_p50 is None or start_p90 is None or ready_p50 is None or ready_p90 is None:
            return f"{ahead}; no estimate yet: {self.note}"
        return f"{ahead}; {_starts(start_p50, start_p90, now)}, ready by {_clock(ready_p50, ready_p90, now)}"


class ReadyEstimate(_Model, kw_only=True):
    """When a job at its provider (submitted or processing) is likely to be ready: its start plus how long its
    model's renders took there, from the typical case (p50) to a late one (p90). The times are None when there
    is no range; `note` says why (and otherwise what they rest on)."""

    ready_p50: datetime | None = None
    ready_p90: datetime | None = None
    unavailable: str | None = None  # too_few_renders, overdue
    note: str = ""

    def describe(self, now: datetime | None = None) -> str:
        """In words, for a person: "ready in about 2–4 min", "ready any moment now", or "no estimate yet:
        <why>"."""
        now = now or datetime.now(UTC)
        if self.ready_p50 is None or self.ready_p90 is None:
            return f"no estimate yet: {self.note}"
        return _within("ready", self.ready_p50, self.ready_p90, now)


class Retry(_Model, kw_only=True):
    """What ended a job's try before the one at hand, once it was retried (its stage stays where it got to)."""

    code: str
    message: str
    max_attempts: int = 0  # the most attempts it may have; 0: not said

    def describe(self, attempt: int, *, retrying: bool = False) -> str:
        """In words: "attempt 2 of 3; the last try ended: <why>", or while the job is `retrying` (its
        `attempt` still the one that ended) "attempt 1 of 3 ended: <why>"."""
        of = f" of {self.max_attempts}" if self.max_attempts else ""
        if retrying:
            return f"attempt {attempt}{of} ended: {self.message}"
        return f"attempt {attempt}{of}; the last try ended: {self.message}"


def _range(low: int, high: int, unit: str = "") -> str:
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def _starts(early: datetime, late: datetime, now: datetime) -> str:
    return _within("starts", early, late, now)


def _within(what: str, early: datetime, late: datetime, now: datetime) -> str:
    """`<what> in about 2–4 min` from now, in the largest unit that reads well, or `<what> any moment now`."""
    low, high = (early - now).total_seconds(), (late - now).total_seconds()
    if high <= 0:
        return f"{what} any moment now"
    if high < 90:
        return f"{what} in about {_range(max(0, math.floor(low)), math.ceil(high), ' s')}"
    if high < 90 * 60:
        return f"{what} in about {_range(max(0, math.floor(low / 60)), math.ceil(high / 60), ' min')}"
    return f"{what} in about {_range(max(0, math.floor(low / 3600)), math.ceil(high / 3600), ' h')}"


def _clock(early: datetime, late: datetime, now: datetime) -> str:
    """Local clock times; to the second when it is minutes away, else to the minute."""
    shape = "%H:%M:%S" if (late - now).total_seconds() < 600 else "%H:%M"
    low, high = early.astimezone().strftime(shape), late.astimezone().strftime(shape)
    return low if low == high else f"{low}–{high}"


class Job(_Model, kw_only=True):
    id: str
    status: str
    stage: str
    model: str
    prompt: str
    created_at: datetime
    updated_at: datetime
    attempt: int = 1
    retry: Retry | None = None  # once retried: what ended the try before (its stage stays where it got to)
    queue_position: int | None = None
    queue_reason: str | None = None
    priority: str = "interactive"  # or "batch": the account's waiting interactive jobs start first
    estimate: QueueEstimate | None = None  # while it waits: when it is likely to start and be ready
    ready: ReadyEstimate | None = None  # while at its provider: when it is likely to be ready
    progress: float | None = None
    error: JobError | None = None
    outputs: Outputs | None = None
    cost: Cost
    duration_s: int | None = None
    aspect_ratio: str | None = None
    resolution: str | None = None
    seed: int | None = None
    negative_prompt: str | None = None
    input_image: str | None = None
    params: dict[str, Any] = {}
    metadata: dict[str, str] = {}
    fallback_models: list[str] = []  # where it may still move while it waits
    max_wait_s: int | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    deadline_at: datetime | None = None
    retry_at: datetime | None = None
    rerun_of: str | None = None  # the job it renders again
    urls: JobUrls | None = None

    @property
    def finished(self) -> bool:
        """Whether the job reached a status it never leaves."""
        return self.status in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "completed"


class JobPage(_Model, kw_only=True):
    data: list[Job]
    next_cursor: str | None = None
    has_more: bool = False


class Transition(_Model, kw_only=True, rename={"from_": "from"}):
    from_: str | None
    to: str
    at: datetime
    reason: str
    stage: str | None = None  # the stage shown after the move (it never goes back); None from an older server


class Trail(_Model, kw_only=True):
    data: list[Transition]


class UploadError(_Model, kw_only=True):
    code: str  # image_corrupt, image_too_large, image_unsupported, image_empty, image_unprocessed
    message: str


class Upload(_Model, kw_only=True):
    id: str
    width: int
    height: int
    content_type: str
    bytes: int
    # processing until the server has decoded the image, then ready (a job may name it) or rejected (`error`)
    status: str = "ready"
    error: UploadError | None = None

    @property
    def processing(self) -> bool:
        return self.status == "processing"


class Export(_Model, kw_only=True):
    """A copy of a job's stored original to a presigned PUT URL of the account's own bucket."""

    id: str
    job_id: str
    host: str  # where it goes; the URL itself is a credential and is never shown back
    # pending until the copy is stored there, then done (`bytes`) or failed (`reason`)
    status: str
    reason: str | None = None  # failed: why; pending: what the last failed try met (it is tried again)
    attempts: int = 0  # tries that failed so far
    bytes: int | None = None  # sent, once done
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def pending(self) -> bool:
        return self.status == "pending"


class ExportList(_Model, kw_only=True):
    data: list[Export]  # newest first, the last 20


class Credits(_Model, kw_only=True):
    balance: int
    reserved: int
    available: int


class Limits(_Model, kw_only=True):
    concurrent_jobs: int
    daily_spend_cap: int | None = None
    max_job_credits: int | None = None
    requests_per_s: float
    request_burst: int
    max_queued_jobs: int
    max_open_streams: int
    max_open_streams_per_key: int
    max_uploads_per_day: int
    max_body_bytes: int
    max_upload_bytes: int
    max_webhook_endpoints: int
    webhook_deliveries_in_flight: int
    webhook_deliveries_per_minute: int
    max_webhook_manual_retries: int
    max_exports_in_flight: int = 10


class Storage(_Model, kw_only=True):
    """What the account's kept clips hold, against its storage quota."""

    used_bytes: int
    limit_bytes: int
    kept_jobs: int


class Account(_Model, kw_only=True):
    id: str
    name: str
    credits: Credits
    limits: Limits
    spent_today: int
    active_jobs: int
    queued_jobs: int
    uploads_today: int
    fallback_models: list[str] = []  # the default for a job that names none
    storage: Storage | None = None  # None from a server older than keeping clips


class LedgerEntry(_Model, kw_only=True):
    id: int
    kind: str
    job_id: str | None = None
    balance_change: int
    reserved_change: int
    balance_after: int
    reserved_after: int
    note: str
    at: datetime
    absorbed: int = 0  # on an `absorb` entry: what the provider billed beyond the charge


class LedgerPage(_Model, kw_only=True):
    data: list[LedgerEntry]
    next_cursor: str | None = None


class UsageGroup(_Model, kw_only=True):
    key: str | None = None  # the model, the UTC day or the metadata value; None: jobs without the key
    jobs: int
    by_status: dict[str, int] = {}
    credits_charged: int
    credits_reserved: int
    seconds_delivered: float


class Usage(_Model, kw_only=True):
    group_by: str
    from_: datetime = msgspec.field(name="from")
    to: datetime
    data: list[UsageGroup]
    truncated: bool = False


class Format(_Model, kw_only=True):
    aspect_ratio: str
    resolution: str
    durations_s: list[int] | None = None


class Model(_Model, kw_only=True):
    id: str
    provider: str
    aliases: list[str] = []
    durations_s: list[int]
    rounds_up: bool = False
    formats: list[Format]
    formats_with_image: list[Format] | None = None
    input_image: str
    negative_prompt: bool
    seed: bool
    credits_per_second: dict[str, float | None] = {}


class ModelList(_Model, kw_only=True):
    data: list[Model]
    rate_card_version: int


class Estimate(_Model, kw_only=True):
    model: str
    estimated_credits: int
    credits_per_second: float
    rate_card_version: int
    available_credits: int
    affordable: bool


class WebhookEndpoint(_Model, kw_only=True):
    id: str
    url: str
    events: list[str]
    description: str = ""
    created_at: datetime
    disabled_at: datetime | None = None
    disabled_reason: str | None = None
    secret_created_at: datetime
    previous_secret_expires_at: datetime | None = None  # while the secret a rotation replaced still signs
    secret: str | None = None  # only in the answer that registered it


class EndpointList(_Model, kw_only=True):
    data: list[WebhookEndpoint]


class Attempt(_Model, kw_only=True):
    at: datetime
    status: int | None = None
    error: str | None = None
    ms: int


class Delivery(_Model, kw_only=True):
    id: str
    job_id: str
    event_type: str
    status: str
    next_attempt_at: datetime | None = None
    created_at: datetime
    attempt_count: int = 0
    attempts: list[Attempt]


class DeliveryList(_Model, kw_only=True):
    data: list[Delivery]
    next_cursor: str | None = None


class WebhookSecret(_Model, kw_only=True):
    """The account's webhook secret, described; the secret itself is only in the answer that made it."""

    created_at: datetime | None = None  # None: not made yet (create_webhook_secret)
    previous_secret_expires_at: datetime | None = None


class NewWebhookSecret(_Model, kw_only=True):
    """A secret just made (the account's, or an endpoint's by a rotation): the one time it is shown."""

    secret: str
    created_at: datetime
    previous_secret_expires_at: datetime | None = None  # until then the secret it replaced signs too


class BrowserToken(_Model, kw_only=True):
    """A short-lived token for a person's browser: send it as `Authorization: Bearer <token>`, or as
    `?access_token=` on a GET (EventSource). Shown in this answer only."""

    id: str
    token: str
    account_id: str
    scopes: list[str]  # read, create, upload
    jobs: list[str] | None = None  # only these jobs (and those it creates); None: every job of the account
    credit_ceiling: int | None = None  # what its creates may reserve together
    expires_at: datetime


# What a platform key (`vjp_...`) sees: `vidjobs_client.Platform`.


class PlatformInfo(_Model, kw_only=True):
    """The platform a key belongs to, and what the key may do."""

    platform_id: str
    platform: str
    key_id: str
    scopes: list[str]


class PlatformLimits(_Model, kw_only=True):
    concurrent_jobs: int
    max_queued_jobs: int | None = None  # None: the platform default
    daily_spend_cap: int | None = None
    max_job_credits: int | None = None
    requests_per_s: float | None = None  # None: the platform default
    request_burst: int | None = None
    storage_quota_bytes: int | None = None


class PlatformAccount(_Model, kw_only=True):
    """One of the platform's accounts (a user of the product), as the platform sees it."""

    id: str
    external_id: str | None = None  # the product's own id of the user
    name: str
    plan: str | None = None  # None: limits of its own
    status: str  # active or disabled
    disabled_at: datetime | None = None
    created_at: datetime
    credits: Credits
    limits: PlatformLimits
    fallback_models: list[str] = []


class PlatformAccountPage(_Model, kw_only=True):
    data: list[PlatformAccount]  # oldest first
    next_cursor: str | None = None


class DisabledAccount(_Model, kw_only=True):
    account: PlatformAccount
    jobs_canceled: list[str]  # the jobs disabling it canceled


class DeletedAccount(_Model, kw_only=True):
    id: str
    status: str  # deleting: its jobs are ending and its data being removed
    jobs_canceled: list[str]
    keys_revoked: int


class CreditChange(_Model, kw_only=True):
    entry: LedgerEntry
    replayed: bool  # an earlier call with the same idempotency key made it; nothing changed now
    credits: Credits


class Plan(_Model, kw_only=True):
    name: str
    concurrent_jobs: int
    max_queued_jobs: int | None = None
    daily_spend_cap: int | None = None
    max_job_credits: int | None = None
    fallback_models: list[str] = []
    accounts: int  # accounts on it
    updated_at: datetime


class PlanList(_Model, kw_only=True):
    data: list[Plan]


class ApiKey(_Model, kw_only=True):
    """An account's API key, described (never the key)."""

    id: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None


class NewApiKey(ApiKey, kw_only=True):
    key: str  # shown in this answer only


class ApiKeyList(_Model, kw_only=True):
    data: list[ApiKey]


class AuditEntry(_Model, kw_only=True):
    """One change a platform key made (or a call it made for an account), and how it was answered."""

    id: int
    at: datetime
    platform_key_id: str
    action: str  # the route's name: create_platform_account, change_platform_account_credit, create_job ...
    account_id: str | None = None
    target: str  # method and path
    status: int
    request_id: str


class AuditPage(_Model, kw_only=True):
    data: list[AuditEntry]  # newest first
    next_cursor: str | None = None


class AccountLimits(TypedDict, total=False):
    """Limits a platform sets on one of its accounts. On an update, None clears a cap (the platform default
    applies) and a limit left out stays as it is."""

    concurrent_jobs: int
    max_queued_jobs: int | None
    daily_spend_cap: int | None
    max_job_credits: int | None
    requests_per_s: float | None
    request_burst: int | None
    storage_quota_bytes: int | None
    fallback_models: list[str]


class PlanLimits(TypedDict, total=False):
    """What a plan carries; left out, the API's default (2 jobs at once, no caps, no fallbacks)."""

    concurrent_jobs: int
    max_queued_jobs: int | None
    daily_spend_cap: int | None
    max_job_credits: int | None
    fallback_models: list[str]


class JobOptions(TypedDict, total=False):
    """What a job may ask for besides its model and prompt (the API's `CreateJob` body)."""

    duration_s: int
    aspect_ratio: str
    resolution: str
    seed: int | None
    negative_prompt: str | None
    input_image: str | None
    params: dict[str, Any]
    metadata: dict[str, str]
    webhook_url: str | None
    webhook_events: list[str] | None
    fallback_models: list[str] | None  # where it may move while it waits; unset: the account's default
    max_wait_s: int | None  # past this wait (estimated), it moves to a fallback that starts sooner
    priority: Literal["interactive", "batch"]  # batch: after the account's waiting interactive jobs


class ListFilter(TypedDict, total=False):
    """Which jobs `list_jobs` and `iter_jobs` return (the query of `GET /v1/jobs`)."""

    status: str | list[str]
    model: str
    created_after: datetime | str
    created_before: datetime | str
    metadata: dict[str, str]
    limit: int
