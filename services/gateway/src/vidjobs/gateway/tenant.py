"""Everything a handler reads or changes on behalf of an account, bound to that account.

A `Tenant` holds the database and one account id, and is obtained only through `tenant(request)`, from the
account the API key authenticated. Every query here names that account, and hides deleted jobs and
uploads, so another account's job and a deleted one look exactly like one that never existed. Handlers
never see the pool or write SQL (tests/test_tenancy.py checks it), so there is no unscoped query for a
handler to forget a check in.
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import msgspec
from aiohttp import web

from vidjobs.common import (
    attempt_costs,
    cancels,
    creation,
    credits,
    deletion,
    estimates,
    ratecard,
    regenerations,
    render_estimates,
    renders,
    uploads,
    waiting,
)
from vidjobs.common.credits import Entry
from vidjobs.common.estimates import Estimate, Estimator
from vidjobs.common.jobs import JobRequest, JobRow, Lane, row_to_job
from vidjobs.common.render_estimates import ReadyRange
from vidjobs.common.renders import Outputs
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import RENDERING, SQL_PENDING, SQL_TERMINAL, TERMINAL, JobStatus
from vidjobs.common.uploads import UploadRow
from vidjobs.gateway import (
    account_usage,
    accounts,
    browsertokens,
    exports,
    fallbacks,
    idempotency,
    intake,
    keeping,
    sealing,
)
from vidjobs.gateway.accounts import Account
from vidjobs.gateway.appwebhooks import endpoints, history, secrets
from vidjobs.gateway.appwebhooks.endpoints import Endpoint
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.state import ACCOUNT, BROWSER_TOKEN, gateway
from vidjobs.providers.base import ProviderAdapter

Conn = asyncpg.Connection | asyncpg.Pool


class OwnedJob(msgspec.Struct, frozen=True):
    """A job of the account, with its place among the account's waiting jobs (None unless it waits)."""

    job: JobRow
    waiting_position: int | None
    outputs: Outputs | None = None  # the stored render's files, from the media service's asset rows
    provider_position: int | None = None  # its place among the account's jobs waiting at its provider
    estimate: Estimate | None = None  # while it waits: when it is likely to start and be ready
    ready: ReadyRange | None = None  # while at its provider: when it is likely to be ready
    provider_credits: int | None = None  # what the provider billed for its attempts (attempt_costs); None: unknown
    absorbed: int | None = None  # what its ledger says the platform paid beyond its charge; None: no such entry


class JobOrder(msgspec.Struct, frozen=True, kw_only=True):
    """A create as its route checked it before anything is written, in the terms its transaction takes."""

    request: JobRequest  # what the provider is asked for, an alias resolved
    route: str | None  # the alias it was chosen through
    # the real models it names to move to, each able to take `request` (the quote is checked in the
    # transaction); None: it names none, so it takes its account's default
    fallbacks: list[str] | None
    metadata: dict[str, str]
    webhook_url: str | None
    webhook_events: list[str] | None  # None without a webhook_url
    max_wait_s: int | None
    lane: Lane
    body_hash: bytes  # idempotency.digest of the body: a key's earlier request must have had the same
    rerun_of: str | None = None  # the job it renders again


class Created(msgspec.Struct, frozen=True):
    job: OwnedJob
    created: bool  # False: the job an earlier request with the same idempotency key made
    regenerated: bool = False  # it renders again what the account had ready (vidjobs.common.regenerations)


class CreateRefused(Exception):
    """A create the account's state refuses (besides its credit and queue: QuotaExhausted, QueueFull)."""


class NoWebhookSecret(CreateRefused):
    """The job names a webhook_url, and the account has no secret to sign deliveries to it with."""


class KeyedJobDeleted(CreateRefused):
    """The idempotency key names a job made earlier that has been deleted since."""


class AccountDisabled(CreateRefused):
    """The account's platform has disabled it: it may read its jobs, not create any."""


class OverTokenCeiling(CreateRefused):
    """The browser token the job is created through has reserved its credit ceiling."""


class AccountState(msgspec.Struct, frozen=True, kw_only=True):
    account: Account
    active_jobs: int  # not finished (waiting, submitted, rendering, retrying, downloading)
    queued_jobs: int  # of those, waiting for a slot
    spent_today: int  # credit committed today (UTC), as the daily cap counts it
    uploads_today: int  # image uploads today (UTC), as the daily cap counts them


# A waiting job's place: vidjobs.common.waiting queue_place_sql, the one definition of it; and its place at its
# provider, which its estimate starts from: estimates.place_sql.
_ONE_JOB = f"""
SELECT j.*,
       CASE WHEN j.status = {SQL_PENDING} THEN {waiting.queue_place_sql("$2", "j.lane", "j.created_at", "j.id")}
       END AS waiting_position,
       CASE WHEN j.status = {SQL_PENDING} THEN {estimates.place_sql("j")} END AS provider_position,
       {renders.outputs_sql("j.id")} AS outputs,
       {attempt_costs.billed_sql("j.id")} AS provider_credits, {attempt_costs.absorbed_sql("j.id")} AS absorbed
FROM jobs j
WHERE j.id = $1 AND j.account_id = $2 AND j.deleted_at IS NULL
"""

# An account's jobs with the places of its waiting ones numbered once for all of them, in queue_place_sql's
# order: MATERIALIZED, or the planner may number them again for every row; their places at their providers
# (estimates.places_sql) likewise. `{where}` picks the rows.
_ACCOUNT_JOBS = f"""
WITH waiting AS MATERIALIZED (
    SELECT id, row_number() OVER (ORDER BY lane, created_at, id) AS position
    FROM jobs WHERE account_id = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
),
places AS MATERIALIZED ({estimates.places_sql("$1")})
SELECT j.*, w.position AS waiting_position, p.place AS provider_position,
       {renders.outputs_sql("j.id")} AS outputs,
       {attempt_costs.billed_sql("j.id")} AS provider_credits, {attempt_costs.absorbed_sql("j.id")} AS absorbed
FROM jobs j LEFT JOIN waiting w ON w.id = j.id LEFT JOIN places p ON p.id = j.id
WHERE j.account_id = $1 AND j.deleted_at IS NULL {{where}}
"""

# Several of the account's jobs at once: what an account's queue moving costs the event streams following its
# jobs, one query whatever their number.
_FOLLOWED_JOBS = _ACCOUNT_JOBS.format(where="AND j.id = ANY($2::text[])")

# Newest first, strictly after the keyset position (the last row of the previous page), with the listing's
# filters, each written only when given so the planner sees plain conditions. What serves it:
# jobs_account_listing (account, newest first) alone or with a time range; jobs_account_status_listing with a
# status; jobs_account_model_listing with a model; jobs_metadata (GIN, containment) with a metadata filter.
_JOB_PAGE = _ACCOUNT_JOBS.format(where="{filters}\nORDER BY j.created_at DESC, j.id DESC\nLIMIT $2")


def page_sql(wanted: JobFilter, after: tuple[datetime, str] | None) -> tuple[str, list[object]]:
    """The listing's statement and its arguments after $1 (the account) and $2 (the limit)."""
    clauses: list[str] = []
    values: list[object] = []

    def arg(value: object, cast: str) -> str:
        values.append(value)
        return f"${len(values) + 2}::{cast}"

    if wanted.statuses and len(wanted.statuses) == 1:
        clauses.append(f"j.status = {arg(wanted.statuses[0].value, 'job_status')}")
    elif wanted.statuses:
        clauses.append(f"j.status = ANY({arg([s.value for s in wanted.statuses], 'job_status[]')})")
    if wanted.model is not None:
        clauses.append(f"j.model = {arg(wanted.model, 'text')}")
    if wanted.created_after is not None:
        clauses.append(f"j.created_at >= {arg(wanted.created_after, 'timestamptz')}")
    if wanted.created_before is not None:
        clauses.append(f"j.created_at < {arg(wanted.created_before, 'timestamptz')}")
    if wanted.metadata:
        clauses.append(f"j.metadata @> {arg(wanted.metadata, 'jsonb')} AND j.metadata <> '{{}}'")
    if after is not None:
        clauses.append(f"(j.created_at, j.id) < ({arg(after[0], 'timestamptz')}, {arg(after[1], 'text')})")
    return _JOB_PAGE.format(filters="".join(f"\n  AND {c}" for c in clauses)), values


# One row per audit entry; a job without entries still answers one row (with NULLs), so "no such job" and
# "no moves yet" stay apart.
_TRAIL = """
SELECT t.from_status, t.to_status, t.stage, t.at, t.reason
FROM jobs j LEFT JOIN job_transitions t ON t.job_id = j.id
WHERE j.id = $1 AND j.account_id = $2 AND j.deleted_at IS NULL
ORDER BY t.id
"""

_ACCOUNT = f"""
SELECT {accounts.columns("a")},
       (SELECT count(*) FROM jobs j
        WHERE j.account_id = $1 AND j.deleted_at IS NULL
          AND j.status NOT IN {SQL_TERMINAL}) AS active_jobs,
       (SELECT count(*) FROM jobs j
        WHERE j.account_id = $1 AND j.deleted_at IS NULL AND j.status = {SQL_PENDING}) AS queued_jobs
FROM accounts a WHERE a.id = $1
"""


class JobFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which of the account's jobs a listing keeps; unset parts keep everything."""

    statuses: list[JobStatus] | None = None
    model: str | None = None
    metadata: dict[str, str] = {}  # every pair must be in the job's metadata
    created_after: datetime | None = None  # at or after
    created_before: datetime | None = None


def _owned(row: asyncpg.Record) -> OwnedJob:
    return OwnedJob(row_to_job(row), row["waiting_position"], renders.decode(row["outputs"]),
                    provider_position=row["provider_position"], provider_credits=row["provider_credits"],
                    absorbed=row["absorbed"])


class Tenant:
    """Reads and changes of one account's jobs, uploads, credit and ledger."""

    __slots__ = ("_adapters", "_estimator", "_routes", "_rt", "account_id", "token_id")

    def __init__(self, rt: Runtime, account_id: str, estimator: Estimator, adapters: dict[str, ProviderAdapter],
                 routes: LiveRoutes, token_id: str | None = None):
        self._rt = rt
        self.account_id = account_id
        # The browser token the request came with: its creates count against its credit ceiling.
        self.token_id = token_id
        self._estimator = estimator  # the process's, whose reads every request and stream share
        self._adapters = adapters  # the process's: which of the account's default fallbacks can take a job
        self._routes = routes  # the process's model routes, read from memory

    def resolve(self, model: str) -> str:
        """The real model `model` is for this account: an alias's sticky route, else the model itself."""
        return self._routes.route(model, self.account_id)[0]

    # --- creating a job ---------------------------------------------------------------------------------
    async def create(self, order: JobOrder, key: str | None) -> Created:
        """The job `order` asks for, made in one transaction: the idempotency `key` looked up (its earlier
        job answered instead), the account's webhook secret checked where the job names a webhook_url, the
        credit reserved and the job queued, the key stored; all of it commits, or none. A new job's estimate
        is made once it has committed. Raises QuotaExhausted, QueueFull, ratecard.Unpriced and CreateRefused;
        idempotency and fallbacks raise their own ApiErrors (a key reused for another body, a fallback over
        the quote)."""
        try:
            made = await self._create_once(order, key)
        except idempotency.LostRace:
            # The winner has committed by now: answer as a replay of its request.
            made = await self._create_once(order, key)
        if not made.created:
            return made
        if made.regenerated:
            regenerations.count(made.job.job.model)  # committed: counted once, here
        return Created(await self.estimated(made.job), created=True)

    async def _create_once(self, order: JobOrder, key: str | None) -> Created:
        settings = self._rt.settings
        async with self._rt.tx() as conn:
            if key is not None and (earlier := await idempotency.previous(
                    conn, self.account_id, key, order.body_hash, settings.idempotency_ttl_s)):
                return Created(await self._replayed(conn, earlier), created=False)
            # Made on purpose by its owner, never here: a secret made silently would be one they never saw.
            if order.webhook_url is not None and not await secrets.has_account_secret(conn, self.account_id):
                raise NoWebhookSecret(self.account_id)
            standing = await conn.fetchrow("SELECT disabled_at, max_queued_jobs FROM accounts WHERE id = $1",
                                           self.account_id)
            if standing is not None and standing["disabled_at"] is not None:
                raise AccountDisabled(self.account_id)
            card = await ratecard.current(conn)
            estimate = ratecard.estimate(card, order.request)
            movable = fallbacks.within_quote(card, order.request, await self._fallbacks(conn, order), estimate,
                                             named=order.fallbacks is not None)
            created = await creation.enqueue(conn, account_id=self.account_id, request=order.request,
                                         estimated_credits=estimate, recovery_delay_s=settings.recovery_delay_s,
                                         route=order.route, rate_card_version=card.version,
                                         max_waiting=_queue_cap(standing, settings.max_queued_jobs),
                                         metadata=order.metadata,
                                         webhook_url=order.webhook_url, webhook_events=order.webhook_events,
                                         fallback_models=movable, max_wait_s=order.max_wait_s, lane=order.lane,
                                         rerun_of=order.rerun_of)
            if self.token_id is not None:
                try:
                    await browsertokens.spend(conn, self.token_id, estimate, created.job.id)
                except browsertokens.OverCeiling as over:
                    raise OverTokenCeiling(str(over)) from over
            if key is not None:
                await idempotency.remember(conn, self.account_id, key, order.body_hash, created.job.id,
                                           settings.idempotency_ttl_s)
            # Its place was counted as it was queued, under the account's lock: no second count.
            at_provider = await estimates.place_at_provider(conn, created.job)
            again = await regenerations.is_regeneration(conn, created.job, settings.regeneration_window_s)
            return Created(OwnedJob(created.job, created.waiting_ahead + 1, provider_position=at_provider), True,
                           regenerated=again)

    async def _fallbacks(self, conn: asyncpg.Connection, order: JobOrder) -> list[str]:
        """What the job names, else its account's default as it is now (read in the create's transaction),
        less the models that cannot take it."""
        if order.fallbacks is not None:
            return order.fallbacks
        default = await conn.fetchval("SELECT fallback_models FROM accounts WHERE id = $1", self.account_id)
        return fallbacks.checked(self._adapters, self.resolve, order.request, None, list(default or []))

    async def _replayed(self, conn: asyncpg.Connection, job_id: str) -> OwnedJob:
        job = await self.job(job_id, conn=conn)
        if job is None:
            raise KeyedJobDeleted(job_id)
        return job

    async def set_fallback_models(self, models: list[str]) -> None:
        """The account's default fallback models, for its jobs that name none."""
        await self._rt.pool.execute("UPDATE accounts SET fallback_models = $2 WHERE id = $1", self.account_id, models)

    async def rate_card(self) -> ratecard.RateCard:
        """The rate card in force: every account's prices, read here so handlers touch no pool directly."""
        return await ratecard.current(self._rt.pool)

    # --- jobs -------------------------------------------------------------------------------------------
    async def job(self, job_id: str, *, conn: Conn | None = None) -> OwnedJob | None:
        row = await (conn or self._rt.pool).fetchrow(_ONE_JOB, job_id, self.account_id)
        return None if row is None else await self.estimated(_owned(row), conn=conn)

    async def jobs(self, wanted: JobFilter, *, after: tuple[datetime, str] | None, limit: int) -> list[OwnedJob]:
        sql, values = page_sql(wanted, after)
        rows = await self._rt.pool.fetch(sql, self.account_id, limit, *values)
        return [await self.estimated(_owned(r)) for r in rows]

    async def followed_jobs(self, job_ids: list[str], *, conn: Conn | None = None) -> dict[str, OwnedJob]:
        """The account's jobs among `job_ids` (a deleted one, or another account's, is absent), by id."""
        rows = await (conn or self._rt.pool).fetch(_FOLLOWED_JOBS, self.account_id, job_ids)
        return {r["id"]: await self.estimated(_owned(r), conn=conn) for r in rows}

    async def original(self, job_id: str) -> JobRow | None:
        """The account's job as stored, deleted or not, for a rerun to tell a deleted job from none at all (a
        job of another account is none)."""
        row = await self._rt.pool.fetchrow("SELECT * FROM jobs WHERE id = $1 AND account_id = $2", job_id,
                                          self.account_id)
        return None if row is None else row_to_job(row)

    async def estimated(self, owned: OwnedJob, *, conn: Conn | None = None) -> OwnedJob:
        """The job with its estimates made afresh from the reads the process shares (no read of its own unless
        they are due, and the job row is not read again): a waiting job's `estimate`, a rendering one's
        `ready`; neither for any other."""
        job = owned.job
        if job.status in RENDERING:
            measured = await self._estimator.measured(conn or self._rt.pool, job.model)
            ready = render_estimates.ready_range(job, measured, self._rt.settings, datetime.now(UTC))
            return msgspec.structs.replace(owned, estimate=None, ready=ready)
        if job.status is not JobStatus.PENDING:
            if owned.estimate is None and owned.ready is None:
                return owned
            return msgspec.structs.replace(owned, estimate=None, ready=None)
        made = await self._estimator.for_job(conn or self._rt.pool, job, owned.provider_position)
        return msgspec.structs.replace(owned, estimate=made, ready=None)

    async def trail(self, job_id: str) -> list[asyncpg.Record] | None:
        """The job's audit trail, oldest first; None if the account has no such job."""
        rows = await self._rt.pool.fetch(_TRAIL, job_id, self.account_id)
        if not rows:
            return None
        return [r for r in rows if r["to_status"] is not None]

    async def cancel(self, job_id: str) -> OwnedJob | None:
        """Cancel a live job; a finished one is left as it is. The job as it now stands, or None."""
        async with self._rt.tx() as conn:
            found = await self.job(job_id, conn=conn)
            if found is None:
                return None
            if found.job.status not in TERMINAL:
                await cancels.cancel(conn, job_id, reason="canceled by owner")
        # Moved or not (another worker may have finished it first), answer with the job as it now stands.
        return await self.job(job_id)

    async def delete(self, job_id: str) -> bool:
        """Hide the job from every read and have its assets removed; False if the account has no such job."""
        async with self._rt.tx() as conn:
            return await deletion.soft_delete(conn, job_id, self.account_id)

    # --- keeping and exporting a clip ---------------------------------------------------------------------
    async def keep(self, job_id: str) -> OwnedJob | None:
        """Keep the job's clip past retention; the job as it now stands, or None. Raises keeping.NotKeepable
        and keeping.OverQuota."""
        async with self._rt.tx() as conn:
            if not await keeping.keep(conn, self.account_id, job_id, self._rt.settings.storage_quota_bytes):
                return None
        return await self.job(job_id)

    async def release(self, job_id: str) -> OwnedJob | None:
        """Stop keeping the job's clip (retention counts from its completion again); the job, or None."""
        await keeping.release(self._rt.pool, self.account_id, job_id)
        return await self.job(job_id)

    async def storage_use(self) -> keeping.StorageUse:
        return await keeping.storage_use(self._rt.pool, self.account_id, self._rt.settings.storage_quota_bytes)

    async def start_export(self, job_id: str, url: str, host: str) -> exports.ExportRow | None:
        """Record an export of the job's original to `url` and queue its copy; None if there is no such job.
        Raises exports.NotExportable and exports.TooManyExports."""
        async with self._rt.tx() as conn:
            return await exports.start(conn, self.account_id, job_id, url, host,
                                       max_pending=self._rt.settings.max_exports_in_flight)

    async def export(self, job_id: str, export_id: str) -> exports.ExportRow | None:
        return await exports.one(self._rt.pool, self.account_id, job_id, export_id)

    async def exports(self, job_id: str, limit: int) -> list[exports.ExportRow]:
        return await exports.of_job(self._rt.pool, self.account_id, job_id, limit)

    # --- webhooks to the account's app -------------------------------------------------------------------
    async def add_endpoint(self, url: str, events: list[str], description: str, *, cap: int,
                           ) -> tuple[Endpoint, str]:
        return await endpoints.add_endpoint(self._rt.pool, self._ring(), self.account_id, url, events, description,
                                            cap=cap)

    async def rotate_endpoint_secret(self, endpoint_id: str, overlap_s: int) -> secrets.Issued | None:
        return await secrets.rotate_endpoint_secret(self._rt.pool, self._ring(), self.account_id, endpoint_id,
                                                    overlap_s)

    async def endpoints(self) -> list[Endpoint]:
        return await endpoints.endpoints(self._rt.pool, self.account_id)

    async def remove_endpoint(self, endpoint_id: str) -> bool:
        return await endpoints.remove_endpoint(self._rt.pool, self.account_id, endpoint_id)

    async def deliveries(self, endpoint_id: str, limit: int, before: tuple[datetime, str] | None = None,
                         ) -> list[history.DeliveryView] | None:
        return await history.endpoint_deliveries(self._rt.pool, self.account_id, endpoint_id, limit, before)

    async def retry_delivery(self, endpoint_id: str, delivery_id: str, *, cap: int) -> history.Retried:
        return await history.retry_delivery(self._rt.pool, self.account_id, endpoint_id, delivery_id, cap=cap)

    async def webhook_secret_held(self) -> secrets.Held:
        """What is known of the account's secret (never the secret itself)."""
        return await secrets.account_secret_held(self._rt.pool, self.account_id)

    async def has_webhook_secret(self) -> bool:
        return await secrets.has_account_secret(self._rt.pool, self.account_id)

    async def issue_webhook_secret(self, overlap_s: int) -> secrets.Issued:
        return await secrets.issue_account_secret(self._rt.pool, self._ring(), self.account_id, overlap_s)

    def _ring(self) -> sealing.Keyring:
        return sealing.keyring(self._rt.settings)

    # --- uploads ----------------------------------------------------------------------------------------
    async def upload(self, upload_id: str) -> UploadRow | None:
        return await uploads.owned(self._rt.pool, self.account_id, upload_id)

    async def disabled(self) -> bool:
        """Whether the account's platform has disabled it (it may read, not make anything)."""
        return bool(await self._rt.pool.fetchval(
            "SELECT disabled_at IS NOT NULL FROM accounts WHERE id = $1", self.account_id))

    async def uploads_today(self) -> int:
        return await intake.count_today(self._rt.pool, self.account_id)

    async def add_upload(self, upload: UploadRow, *, daily_cap: int) -> bool:
        """Record the upload; False (recording nothing) when the account made `daily_cap` today already."""
        if upload.account_id != self.account_id:
            raise ValueError(f"upload {upload.id} is for another account")
        # Through the runtime's transaction: the upload's event is published as soon as the row commits.
        async with self._rt.tx() as conn:
            return await intake.insert_capped(conn, upload, daily_cap)

    # --- the account ------------------------------------------------------------------------------------
    async def account(self) -> AccountState | None:
        row = await self._rt.pool.fetchrow(_ACCOUNT, self.account_id)
        if row is None:
            return None
        account = accounts.account_of(row)
        spent = await credits.committed_on(self._rt.pool, self.account_id)  # today, UTC
        return AccountState(account=account, active_jobs=row["active_jobs"], queued_jobs=row["queued_jobs"],
                            spent_today=spent, uploads_today=await self.uploads_today())

    async def usage(self, grouping: account_usage.Grouping, start: datetime, end: datetime,
                    ) -> tuple[list[account_usage.Group], bool]:
        """The account's jobs created in [start, end), grouped; and whether groups were cut off."""
        return await account_usage.report(self._rt.pool, self.account_id, grouping, start, end)

    async def ledger(self, *, before_id: int | None, limit: int) -> list[Entry]:
        """The account's credit ledger, newest first, strictly before entry `before_id`."""
        return await credits.entries(self._rt.pool, self.account_id, before_id=before_id, limit=limit)


def _queue_cap(standing: asyncpg.Record | None, default: int) -> int:
    own = None if standing is None else standing["max_queued_jobs"]
    return default if own is None else own


def tenant(request: web.Request) -> Tenant:
    """The caller's tenant. Only routes behind an API key have one: asking on any other is a bug."""
    if ACCOUNT not in request:
        raise RuntimeError(f"route {request.match_info.route.name!r} has no authenticated account")
    gw = gateway(request)
    token = request.get(BROWSER_TOKEN)
    return Tenant(gw.rt, request[ACCOUNT].id, gw.estimator, gw.adapters, gw.routes,
                  token_id=None if token is None else token.id)
