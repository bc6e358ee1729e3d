"""Request and response bodies of the platform routes (`/v1/platform/...`) and of browser tokens, as msgspec
Structs: what a product's backend sends to manage its users' accounts (docs/INTEGRATING.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from vidjobs.gateway.bodies import Credits, Fallbacks, LedgerEntryOut
from vidjobs.gateway.browsertokens import MAX_JOBS, MAX_TTL_S, MIN_TTL_S, TokenScope

MAX_CREDITS = 10**12  # one grant, one ceiling or one cap: far past any purchase, far below bigint
ExternalId = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$",
                                 description="your own id of the user (1-256 printable ASCII characters, no spaces); "
                                             "unique per platform", examples=["user_8412"])]
AccountName = Annotated[str, Meta(max_length=200)]
PlanName = Annotated[str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,39}$", description="1-40 of a-z, 0-9, `_`, `-`",
                               examples=["pro"])]
AccountId = Annotated[str, Meta(pattern=r"^acct_[0-9a-z]{1,64}$")]
JobId = Annotated[str, Meta(pattern=r"^job_[0-9a-z]{1,64}$")]
Concurrency = Annotated[int, Meta(ge=1, le=10_000)]
QueuedJobs = Annotated[int, Meta(ge=0, le=1_000_000)]
SpendCap = Annotated[int, Meta(ge=0, le=MAX_CREDITS)]
JobMax = Annotated[int, Meta(ge=1, le=MAX_CREDITS)]
Rate = Annotated[float, Meta(gt=0, le=10_000)]
Burst = Annotated[int, Meta(ge=1, le=100_000)]
QuotaBytes = Annotated[int, Meta(ge=0, le=2**50)]
CreditAmount = Annotated[int, Meta(ge=1, le=MAX_CREDITS, description="credits, a whole number")]
IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
                                     description="your billing provider's event id: the same key is one change")]
Reason = Annotated[str, Meta(max_length=500)]


class AccountLimits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Limits a platform sets on one of its accounts; in a PATCH, fields left out stay as they are and null
    clears a cap (the platform default applies)."""

    concurrent_jobs: Concurrency | UnsetType = UNSET  # renders in flight at once
    max_queued_jobs: QueuedJobs | None | UnsetType = UNSET  # jobs waiting for a slot; null: the platform default
    daily_spend_cap: SpendCap | None | UnsetType = UNSET  # credits committed per UTC day; null: no cap
    max_job_credits: JobMax | None | UnsetType = UNSET  # the most one job may be estimated at; null: no maximum
    requests_per_s: Rate | None | UnsetType = UNSET  # API requests per second per key; null: the platform default
    request_burst: Burst | None | UnsetType = UNSET
    storage_quota_bytes: QuotaBytes | None | UnsetType = UNSET  # what kept clips may hold; null: the default
    fallback_models: Fallbacks | UnsetType = UNSET  # default fallbacks of its jobs that name none


class CreatePlatformAccount(AccountLimits, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts`. Made again with the same external_id, the account made first is
    answered (200) and nothing changes."""

    external_id: ExternalId
    name: AccountName = ""
    plan: PlanName | None = None  # a plan's limits; limits given beside it override them


class PatchPlatformAccount(AccountLimits, kw_only=True, forbid_unknown_fields=True):
    """Body of `PATCH /v1/platform/accounts/{account_id}`. A plan sets every limit it carries; a limit given
    here (with or without a plan) is the account's own and takes it off its plan."""

    name: AccountName | UnsetType = UNSET
    plan: PlanName | UnsetType = UNSET


class PlatformLimitsOut(msgspec.Struct, kw_only=True):
    concurrent_jobs: int
    max_queued_jobs: int | None  # null: the platform default
    daily_spend_cap: int | None
    max_job_credits: int | None
    requests_per_s: float | None  # null: the platform default
    request_burst: int | None
    storage_quota_bytes: int | None


class PlatformAccountOut(msgspec.Struct, kw_only=True):
    id: str
    external_id: str | None  # null for an account the operator made
    name: str
    plan: str | None  # null: limits of its own
    status: Literal["active", "disabled"]
    disabled_at: datetime | None
    created_at: datetime
    credits: Credits
    limits: PlatformLimitsOut
    fallback_models: list[str]


class PlatformAccountPage(msgspec.Struct, kw_only=True):
    data: list[PlatformAccountOut]  # oldest first
    next_cursor: str | None


class PlatformAccountsQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    external_id: ExternalId | None = None  # only the account of this user
    limit: Annotated[int, Meta(ge=1, le=100)] = 20
    cursor: str | None = None


class DisableAccount(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts/{account_id}/disable`. Waiting jobs are canceled and their credit
    released either way; running ones finish (`finish`) or are stopped (`stop`)."""

    running: Literal["finish", "stop"] = "finish"
    reason: Reason = ""


class DisabledOut(msgspec.Struct, kw_only=True):
    account: PlatformAccountOut
    jobs_canceled: list[str]  # jobs this call canceled


class DeletedAccountOut(msgspec.Struct, kw_only=True):
    id: str
    status: Literal["deleting", "deleted"]  # deleting: its jobs are ending and its data being removed
    jobs_canceled: list[str]
    keys_revoked: int


class CreditChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts/{account_id}/credits`."""

    action: Literal["grant", "take_back"]
    amount: CreditAmount
    idempotency_key: IdempotencyKey
    reason: Reason = ""


class CreditChangeOut(msgspec.Struct, kw_only=True):
    entry: LedgerEntryOut
    replayed: bool  # true: an earlier call with this idempotency key made it; nothing changed now
    credits: Credits


class Plan(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PUT /v1/platform/plans/{plan}`: every account on the plan takes these limits at once."""

    concurrent_jobs: Concurrency = 2
    max_queued_jobs: QueuedJobs | None = None
    daily_spend_cap: SpendCap | None = None
    max_job_credits: JobMax | None = None
    fallback_models: Fallbacks = []


class PlanOut(Plan, kw_only=True):
    name: str
    accounts: int  # accounts on it
    updated_at: datetime


class PlanList(msgspec.Struct, kw_only=True):
    data: list[PlanOut]


class NewKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(max_length=100)] = ""


class KeyOut(msgspec.Struct, kw_only=True):
    id: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class NewKeyOut(KeyOut, kw_only=True):
    key: str  # shown once; stored only hashed


class KeyList(msgspec.Struct, kw_only=True):
    data: list[KeyOut]


class NewToken(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/account/tokens` and `POST /v1/platform/accounts/{account_id}/tokens`."""

    scopes: Annotated[list[TokenScope], Meta(min_length=1, max_length=3)] = msgspec.field(
        default_factory=lambda: [TokenScope.READ])
    # only these jobs (and those it creates); left out: every job of the account
    jobs: Annotated[list[JobId], Meta(max_length=MAX_JOBS)] | None = None
    ttl_s: Annotated[int, Meta(ge=MIN_TTL_S, le=MAX_TTL_S, description="seconds it lives, 60-3600")] = 900
    # with `create`: what its jobs may reserve together, in credits; null: only the account's own limits
    credit_ceiling: Annotated[int, Meta(ge=0, le=MAX_CREDITS)] | None = None


class TokenOut(msgspec.Struct, kw_only=True):
    id: str
    token: str  # send as `Authorization: Bearer <token>`, or as `?access_token=` on a GET (EventSource)
    account_id: str
    scopes: list[str]
    jobs: list[str] | None
    credit_ceiling: int | None
    expires_at: datetime


class AuditEntryOut(msgspec.Struct, kw_only=True):
    id: int
    at: datetime
    platform_key_id: str  # who
    action: str  # what: the route's name (e.g. `create_platform_account`, or an account route acted for)
    account_id: str | None
    target: str  # the path it was asked on
    status: int  # how it was answered
    request_id: str


class AuditPage(msgspec.Struct, kw_only=True):
    data: list[AuditEntryOut]  # newest first
    next_cursor: str | None


class AuditQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    account_id: AccountId | None = None
    limit: Annotated[int, Meta(ge=1, le=100)] = 50
    cursor: str | None = None


class PlatformOut(msgspec.Struct, kw_only=True):
    """`GET /v1/platform`: who the key is."""

    platform_id: str
    platform: str
    key_id: str
    scopes: list[str]
