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
    request_burst: Burst | None | UnsetType = UNSET  # requests at once after a quiet spell; null: the platform default
    storage_quota_bytes: QuotaBytes | None | UnsetType = UNSET  # what kept clips may hold; null: the default
    fallback_models: Fallbacks | UnsetType = UNSET  # default fallbacks of its jobs that name none


class CreatePlatformAccount(AccountLimits, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts`. Made again with the same external_id, the account made first is
    answered (200) and nothing changes."""

    external_id: ExternalId
    name: AccountName = ""  # a name to show; the external_id when left out
    plan: PlanName | None = None  # a plan's limits; limits given beside it override them


class PatchPlatformAccount(AccountLimits, kw_only=True, forbid_unknown_fields=True):
    """Body of `PATCH /v1/platform/accounts/{account_id}`. A plan sets every limit it carries; a limit given
    here (with or without a plan) is the account's own and takes it off its plan."""

    name: AccountName | UnsetType = UNSET  # a new name to show
    plan: PlanName | UnsetType = UNSET


class PlatformLimitsOut(msgspec.Struct, kw_only=True):
    concurrent_jobs: int  # renders in flight at once
    max_queued_jobs: int | None  # null: the platform default
    daily_spend_cap: int | None  # credits committed per UTC day; null: no cap
    max_job_credits: int | None  # the most one job may be estimated at; null: no maximum
    requests_per_s: float | None  # null: the platform default
    request_burst: int | None  # null: the platform default
    storage_quota_bytes: int | None  # what kept clips may hold; null: the platform default


class PlatformAccountOut(msgspec.Struct, kw_only=True):
    id: str  # the account's id: name it in paths and in Vidjobs-Account
    external_id: str | None  # null for an account the operator made
    name: str  # its name
    plan: str | None  # null: limits of its own
    status: Literal["active", "disabled"]  # active, or disabled (it may read, not create)
    disabled_at: datetime | None  # when it was disabled; null while active
    created_at: datetime  # when it was made
    credits: Credits  # its credit now
    limits: PlatformLimitsOut  # its own limits (null: the platform default)
    fallback_models: list[str]  # default fallbacks of its jobs that name none


class PlatformAccountPage(msgspec.Struct, kw_only=True):
    data: list[PlatformAccountOut]  # oldest first
    next_cursor: str | None  # pass as `cursor` for the next page; null on the last


class PlatformAccountsQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    external_id: ExternalId | None = None  # only the account of this user
    limit: Annotated[int, Meta(ge=1, le=100)] = 20  # accounts per page, 1-100
    cursor: str | None = None  # next_cursor of the previous page


class DisableAccount(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts/{account_id}/disable`. Waiting jobs are canceled and their credit
    released either way; running ones finish (`finish`) or are stopped (`stop`)."""

    running: Literal["finish", "stop"] = "finish"  # its running jobs: finish them, or stop them
    reason: Reason = ""  # why, for the canceled jobs' trail


class DisabledOut(msgspec.Struct, kw_only=True):
    account: PlatformAccountOut  # the account as it is now
    jobs_canceled: list[str]  # jobs this call canceled


class DeletedAccountOut(msgspec.Struct, kw_only=True):
    id: str  # the account
    status: Literal["deleting", "deleted"]  # deleting: its jobs are ending and its data being removed
    jobs_canceled: list[str]  # live jobs this call canceled
    keys_revoked: int  # API keys this call revoked


class CreditChange(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/platform/accounts/{account_id}/credits`."""

    action: Literal["grant", "take_back"]  # grant adds credit; take_back removes unreserved credit
    amount: CreditAmount
    idempotency_key: IdempotencyKey
    reason: Reason = ""  # kept in the ledger entry's note


class CreditChangeOut(msgspec.Struct, kw_only=True):
    entry: LedgerEntryOut  # the ledger entry of the change
    replayed: bool  # true: an earlier call with this idempotency key made it; nothing changed now
    credits: Credits  # the account's credit now


class Plan(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `PUT /v1/platform/plans/{plan}`: every account on the plan takes these limits at once."""

    concurrent_jobs: Concurrency = 2  # renders in flight at once
    max_queued_jobs: QueuedJobs | None = None  # jobs waiting for a slot; null: the platform default
    daily_spend_cap: SpendCap | None = None  # credits committed per UTC day; null: no cap
    max_job_credits: JobMax | None = None  # the most one job may be estimated at; null: no maximum
    fallback_models: Fallbacks = []


class PlanOut(Plan, kw_only=True):
    name: str  # the plan's name
    accounts: int  # accounts on it
    updated_at: datetime  # when its limits last changed


class PlanList(msgspec.Struct, kw_only=True):
    data: list[PlanOut]  # the platform's plans, by name


class NewKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(max_length=100)] = ""  # a name to recognise the key by


class KeyOut(msgspec.Struct, kw_only=True):
    id: str  # the key's id, to revoke it
    name: str  # its name
    prefix: str  # the key's first characters, enough to recognise it
    created_at: datetime  # when it was made
    last_used_at: datetime | None  # when it was last used; null: never
    revoked_at: datetime | None  # when it was revoked; null: live


class NewKeyOut(KeyOut, kw_only=True):
    key: str  # shown once; stored only hashed


class KeyList(msgspec.Struct, kw_only=True):
    data: list[KeyOut]  # the account's keys, oldest first


class NewToken(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /v1/account/tokens` and `POST /v1/platform/accounts/{account_id}/tokens`."""

    # what the token may do: read, create, upload (at least one)
    scopes: Annotated[list[TokenScope], Meta(min_length=1, max_length=3)] = msgspec.field(
        default_factory=lambda: [TokenScope.READ])
    # only these jobs (and those it creates); left out: every job of the account
    jobs: Annotated[list[JobId], Meta(max_length=MAX_JOBS)] | None = None
    ttl_s: Annotated[int, Meta(ge=MIN_TTL_S, le=MAX_TTL_S, description="seconds it lives, 60-3600")] = 900
    # with `create`: what its jobs may reserve together, in credits; null: only the account's own limits
    credit_ceiling: Annotated[int, Meta(ge=0, le=MAX_CREDITS)] | None = None


class TokenOut(msgspec.Struct, kw_only=True):
    id: str  # the token's grant, as the audit and logs name it
    token: str  # send as `Authorization: Bearer <token>`, or as `?access_token=` on a GET (EventSource)
    account_id: str  # the account whose jobs it reaches
    scopes: list[str]  # what it may do
    jobs: list[str] | None  # the jobs it is limited to (and those it creates); null: every job of the account
    credit_ceiling: int | None  # what its creates may reserve together; null: no ceiling of its own
    expires_at: datetime  # when it stops working


class TokenGrantOut(msgspec.Struct, kw_only=True):
    """`GET /v1/token`: what the calling browser token may do (never the token itself)."""

    id: str  # the token's grant
    account_id: str  # the account whose jobs it reaches
    scopes: list[str]  # what it may do: read, create, upload
    jobs: list[str] | None  # the jobs it is limited to (with those it created); null: every job of the account
    credit_ceiling: int | None  # what its creates may reserve together; null: no ceiling of its own
    credits_used: int  # what its creates reserved so far
    expires_at: datetime  # when it stops working


class AuditEntryOut(msgspec.Struct, kw_only=True):
    id: int  # its place in the trail
    at: datetime  # when it was answered
    platform_key_id: str  # who
    action: str  # what: the route's name (e.g. `create_platform_account`, or an account route acted for)
    account_id: str | None  # the account it concerned, if any
    target: str  # the path it was asked on
    status: int  # how it was answered
    request_id: str  # the request's X-Request-Id


class AuditPage(msgspec.Struct, kw_only=True):
    data: list[AuditEntryOut]  # newest first
    next_cursor: str | None  # pass as `cursor` for the next page; null on the last


class AuditQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    account_id: AccountId | None = None  # only the lines about this account
    limit: Annotated[int, Meta(ge=1, le=100)] = 50  # lines per page, 1-100
    cursor: str | None = None  # next_cursor of the previous page


class PlatformOut(msgspec.Struct, kw_only=True):
    """`GET /v1/platform`: who the key is."""

    platform_id: str  # the platform's id
    platform: str  # the platform's name, as the operator made it
    key_id: str  # this key's id, as the audit trail names it
    scopes: list[str]  # what this key may do
