"""The asynchronous client: the same methods as `vidjobs_client.Client`, awaitable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Literal, TypeVar, Unpack

import httpx

from . import calls, connection, models
from .calls import Call, api_error, decode
from .downloads import CHUNK, Download, Part, source, target_path
from .errors import WaitTimeout
from .following import READ_TIMEOUT_S, Follower, StreamEnded, StreamRefused
from .retrying import RetryPolicy

T = TypeVar("T")


class AsyncClient:
    """A connection to the vidjobs API.

    `base_url` and `api_key` default to `VIDJOBS_URL` and `VIDJOBS_API_KEY`. With a platform key (`vjp_...`) and
    `account_id`, it calls the account's routes for one of the platform's accounts (`Platform.acting_for`).
    Refusals the API marks retryable (429, 503) and connections that fail are retried as `retry` says; anything
    else raises an `APIError` whose `code` is the API's error code. Use it as an async context manager, or await
    `close()`.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.AsyncClient | None = None,
                 account_id: str | None = None) -> None:
        self.base_url, self._key = connection.resolve(base_url, api_key)
        self.account_id = account_id
        self._retry = retry or RetryPolicy()
        self._http = http or httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s,
                                          headers={"User-Agent": connection.USER_AGENT})

    async def close(self) -> None:
        """Close the connections this client opened."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _send(self, call: Call[T]) -> T:
        headers = connection.request_headers(call, self._key, self.account_id)
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = await self._http.request(call.method, call.path, params=call.query, content=call.body,
                                          headers=headers)
            except httpx.TransportError as exc:
                wait = self._retry.after_failure(call, attempt, exc)
            else:
                if resp.is_success:
                    return decode(call, resp.content)
                wait = self._retry.after_refusal(call, attempt, api_error(resp.status_code, resp.headers,
                                                                          resp.content))
            await asyncio.sleep(wait)

    # Jobs

    async def create_job(self, model: str, prompt: str, *, idempotency_key: str | None = None,
                   **options: Unpack[models.JobOptions]) -> models.Job:
        """Create a render job. An idempotency key is generated unless given, so a retried create never
        makes a second job. `priority="batch"` queues it behind the account's waiting interactive jobs."""
        return await self._send(calls.create_job(model, prompt, options, idempotency_key))

    async def estimate(self, model: str, prompt: str, **options: Unpack[models.JobOptions]) -> models.Estimate:
        """What creating this job would reserve, checked as a create is, without creating anything."""
        return await self._send(calls.estimate(model, prompt, options))

    async def get_job(self, job_id: str) -> models.Job:
        """One job, as it stands."""
        return await self._send(calls.get_job(job_id))

    async def list_jobs(self, cursor: str | None = None, **filters: Unpack[models.ListFilter]) -> models.JobPage:
        """One page of the account's jobs, newest first; pass `next_cursor` for the next."""
        return await self._send(calls.list_jobs(filters, cursor))

    async def iter_jobs(self, **filters: Unpack[models.ListFilter]) -> AsyncIterator[models.Job]:
        """Every job that matches, newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = await self.list_jobs(cursor, **filters)
            for job in page.data:
                yield job
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel_job(self, job_id: str) -> models.Job:
        """Cancel a job; one already finished is answered unchanged."""
        return await self._send(calls.cancel_job(job_id))

    async def rerun_job(self, job_id: str, *, idempotency_key: str | None = None) -> models.Job:
        """Render a job's request again as a new job (its `rerun_of` names the original). An idempotency key
        is generated unless given, so a retried rerun never makes a second job."""
        return await self._send(calls.rerun_job(job_id, idempotency_key))

    async def delete_job(self, job_id: str) -> None:
        """Delete a job and its files."""
        await self._send(calls.delete_job(job_id))

    async def job_events(self, job_id: str) -> list[models.Transition]:
        """The job's audit trail, oldest first."""
        return (await self._send(calls.job_events(job_id))).data

    async def stream_job(self, job_id: str, *, timeout_s: float | None = None) -> AsyncIterator[models.Job]:
        """The job now and at every change until it finishes, reconnecting when the connection drops.

        Raises `WaitTimeout` if it has not finished within `timeout_s`."""
        follower = Follower(job_id, self._retry)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                async for job in self._connection(follower, deadline):
                    yield job
                return
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} did not finish within {timeout_s} s") from exc
                wait = follower.dropped(exc)
            except StreamEnded:
                wait = follower.dropped(None)
            except StreamRefused as refused:
                wait = follower.refused(refused.error)
            await asyncio.sleep(wait)

    async def _connection(self, follower: Follower, deadline: float | None) -> AsyncIterator[models.Job]:
        """Events of one connection; returns when the job finished, raises `StreamEnded` if the stream ended first."""
        read_s = READ_TIMEOUT_S if deadline is None else max(0.01, min(READ_TIMEOUT_S, deadline - time.monotonic()))
        timeout = httpx.Timeout(self._http.timeout.connect, read=read_s)
        headers = {**connection.request_headers(follower.call, self._key, self.account_id),
                   "Accept": "text/event-stream"}
        async with self._http.stream("GET", follower.call.path, headers=headers, timeout=timeout) as resp:
            if not resp.is_success:
                raise StreamRefused(api_error(resp.status_code, resp.headers, await resp.aread()))
            follower.connected()
            async for line in resp.aiter_lines():
                if (job := follower.line(line)) is not None:
                    yield job
                    if job.finished:
                        return
        raise StreamEnded

    async def wait(self, job_id: str, *, timeout_s: float | None = None,
             on_change: Callable[[models.Job], None] | None = None) -> models.Job:
        """Follow the job until it finishes and return it as it ended (completed, failed, canceled or
        expired). `on_change` sees every state on the way."""
        async for job in self.stream_job(job_id, timeout_s=timeout_s):
            if on_change is not None:
                on_change(job)
            if job.finished:
                return job
        raise AssertionError("the stream ends only with a finished job")

    async def download(self, job: models.Job | str, dest: str | Path | None = None, *, part: Part = "video",
                 on_progress: Callable[[int, int | None], None] | None = None) -> Path:
        """Save the job's video (or `part="thumbnail"` / `"preview"`) to `dest` (a file, or a folder for
        `<job id>.mp4`) and return its path. The video is checked against the job's sha256 and size; a
        mismatch raises `ChecksumMismatch` and keeps nothing."""
        job = await self.get_job(job) if isinstance(job, str) else job
        load = Download(job, part, target_path(job, dest, part))
        out = await asyncio.to_thread(load.partial.open, "wb")
        try:
            await self._fetch(load, out, on_progress)
        finally:
            await asyncio.to_thread(out.close)
        load.check()
        load.partial.replace(load.target)
        return load.target

    async def _fetch(self, load: Download, out: BinaryIO,
                     on_progress: Callable[[int, int | None], None] | None) -> None:
        url, attempt = source(load.job, load.part), 0
        while True:
            attempt += 1
            try:
                async with self._http.stream("GET", url, headers=load.range_header()) as resp:
                    if resp.status_code in (401, 403, 404) and not load.refreshed:
                        load.refreshed, url = True, source(await self.get_job(load.job.id), load.part)
                        continue  # a signed URL that expired: read the job for fresh ones
                    if not resp.is_success:
                        raise api_error(resp.status_code, resp.headers, await resp.aread())
                    if not load.answered(resp.status_code, resp.headers.get("Content-Length")):
                        await asyncio.to_thread(_restart, out)
                    async for chunk in resp.aiter_bytes(CHUNK):
                        await asyncio.to_thread(out.write, chunk)
                        load.add(chunk)
                        if on_progress is not None:
                            on_progress(load.written, load.total)
                return
            except httpx.TransportError as exc:
                await asyncio.sleep(self._retry.after_failure(Call("GET", url, None), attempt, exc))

    # Keeping and exporting clips

    async def keep_job(self, job_id: str) -> models.Job:
        """Keep a ready job's clip past retention (`outputs.kept`), counted against the account's storage quota.
        `Conflict` with code `conflict` if the job is not ready, `storage_quota_exceeded` past the quota."""
        return await self._send(calls.keep_job(job_id))

    async def release_job(self, job_id: str) -> models.Job:
        """Stop keeping the job's clip: retention counts from its completion again (`outputs.retained_until`)."""
        return await self._send(calls.release_job(job_id))

    async def export_job(self, job_id: str, url: str, *, wait: bool = False,
                         timeout_s: float | None = 600.0) -> models.Export:
        """Copy a ready job's stored original to `url`, a presigned PUT URL of your own bucket (`Conflict` if the
        job is not ready). The copy is made after answering: it is returned pending unless `wait`, which asks
        until it is done or failed (see `reason`), or raises `WaitTimeout` past `timeout_s`."""
        export = await self._send(calls.export_job(job_id, url))
        return await self.wait_export(export, timeout_s=timeout_s) if wait else export

    async def wait_export(self, export: models.Export, *, timeout_s: float | None = 600.0) -> models.Export:
        """Ask about an export until it is done or failed (see `reason`); `WaitTimeout` past `timeout_s`."""
        current, pauses = export, calls.export_pauses(export, timeout_s)
        while current.pending:
            await asyncio.sleep(next(pauses))
            current = await self.get_export(current.job_id, current.id)
        return current

    async def get_export(self, job_id: str, export_id: str) -> models.Export:
        """One export of the job, as it stands: pending, done or failed."""
        return await self._send(calls.get_export(job_id, export_id))

    async def list_exports(self, job_id: str) -> list[models.Export]:
        """The job's exports, newest first (the last 20)."""
        return (await self._send(calls.list_exports(job_id))).data

    # Uploads, account, models, webhooks

    async def upload(self, image: str | Path | bytes, content_type: str | None = None, *, wait: bool = True,
                     timeout_s: float | None = 120.0) -> models.Upload:
        """Upload a PNG, JPEG or WebP image; name its id as a job's `input_image`. The server decodes it after
        answering: by default this waits until it is ready (`UploadRejected` if the image was refused,
        `WaitTimeout` past `timeout_s`); `wait=False` returns it still processing (see `wait_upload`)."""
        if isinstance(image, bytes):
            upload = await self._send(calls.upload(image, content_type or "application/octet-stream"))
        else:
            path = Path(image)
            data = await asyncio.to_thread(path.read_bytes)
            upload = await self._send(calls.upload(data, content_type or calls.image_type(path)))
        return await self.wait_upload(upload, timeout_s=timeout_s) if wait else upload

    async def get_upload(self, upload_id: str) -> models.Upload:
        """The upload as it stands: processing, ready or rejected (with `error`)."""
        return await self._send(calls.get_upload(upload_id))

    async def wait_upload(self, upload: models.Upload | str, *, timeout_s: float | None = 120.0) -> models.Upload:
        """The upload once decoded and ready; raises `UploadRejected` or `WaitTimeout`."""
        current = await self.get_upload(upload) if isinstance(upload, str) else upload
        pauses = calls.upload_pauses(current, timeout_s)
        while current.processing:
            await asyncio.sleep(next(pauses))
            current = await self.get_upload(current.id)
        return calls.settled(current)

    async def account(self) -> models.Account:
        """The account: credit, limits in force and jobs under way."""
        return await self._send(calls.account())

    async def set_fallback_models(self, fallback_models: list[str]) -> models.Account:
        """The account's default fallback models, for its jobs that name none ([] for none)."""
        return await self._send(calls.set_fallback_models(fallback_models))

    async def create_token(self, *, scopes: list[str] | None = None, jobs: list[str] | None = None,
                           ttl_s: int | None = None, credit_ceiling: int | None = None) -> models.BrowserToken:
        """A short-lived browser token for this account, to hand to one of its people's browsers: `scopes` of
        read (the default), create and upload; only `jobs` (and those it creates), else every job; `ttl_s` of
        60-3600 (default 900); with create, a `credit_ceiling` on what its jobs reserve together."""
        return await self._send(calls.create_token(scopes, jobs, ttl_s, credit_ceiling))

    async def ledger(self, *, limit: int | None = None, cursor: str | None = None) -> models.LedgerPage:
        """One page of the account's credit ledger, newest first."""
        return await self._send(calls.ledger(limit, cursor))

    async def usage(self, *, group_by: str | None = None, start: datetime | None = None,
                    end: datetime | None = None) -> models.Usage:
        """The account's jobs created in [start, end) (default: the last 30 days), grouped by `model`, `day`
        (UTC, the default) or `metadata.<key>`: jobs by status, credits charged and held, seconds delivered."""
        return await self._send(calls.usage(group_by, start, end))

    async def list_models(self) -> list[models.Model]:
        """The models this deployment renders with, what each takes and its price."""
        return (await self._send(calls.list_models())).data

    async def webhook_secret(self) -> models.WebhookSecret:
        """When the secret that signs deliveries to the `webhook_url` a job names was made (not the secret)."""
        return await self._send(calls.webhook_secret())

    async def create_webhook_secret(self, *, overlap_s: int | None = None) -> models.NewWebhookSecret:
        """Make the account's webhook secret, or replace it (the old one signs too for `overlap_s`, default a
        day); its `secret` is in this answer only."""
        return await self._send(calls.create_webhook_secret(overlap_s))

    async def create_webhook_endpoint(self, url: str, *, events: list[str] | None = None,
                                description: str = "") -> models.WebhookEndpoint:
        """Register an endpoint of your app; its `secret` is in this answer only."""
        return await self._send(calls.create_webhook_endpoint(url, events, description))

    async def list_webhook_endpoints(self) -> list[models.WebhookEndpoint]:
        """Your webhook endpoints, oldest first."""
        return (await self._send(calls.list_webhook_endpoints())).data

    async def rotate_webhook_endpoint_secret(self, endpoint_id: str, *,
                                             overlap_s: int | None = None) -> models.NewWebhookSecret:
        """Replace an endpoint's secret (the old one signs too for `overlap_s`, default a day); the new `secret`
        is in this answer only."""
        return await self._send(calls.rotate_webhook_endpoint_secret(endpoint_id, overlap_s))

    async def delete_webhook_endpoint(self, endpoint_id: str) -> None:
        """Remove an endpoint; nothing more is sent to it."""
        await self._send(calls.delete_webhook_endpoint(endpoint_id))

    async def deliveries(self, endpoint_id: str, cursor: str | None = None) -> models.DeliveryList:
        """One page of what was delivered to an endpoint, newest first, each with its last attempts; pass
        `next_cursor` for the next."""
        return await self._send(calls.deliveries(endpoint_id, cursor))

    async def iter_deliveries(self, endpoint_id: str) -> AsyncIterator[models.Delivery]:
        """Everything delivered to an endpoint, newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = await self.deliveries(endpoint_id, cursor)
            for delivery in page.data:
                yield delivery
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def retry_delivery(self, endpoint_id: str, delivery_id: str) -> None:
        """Send a delivery again now."""
        await self._send(calls.retry_delivery(endpoint_id, delivery_id))


class AsyncPlatform:
    """A product's backend managing its users' accounts with a platform key (`vjp_...`).

    The same methods as `vidjobs_client.Platform`, awaitable. `base_url` and `platform_key` default to
    `VIDJOBS_URL` and `VIDJOBS_PLATFORM_KEY`; `acting_for` gives an `AsyncClient` that calls one account's own
    routes for it. Use it as an async context manager, or await `close()`.
    """

    def __init__(self, base_url: str | None = None, platform_key: str | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.AsyncClient | None = None) -> None:
        self.base_url, self._key = connection.resolve(base_url, platform_key, what="platform key",
                                                      argument="platform_key",
                                                      variable=connection.PLATFORM_KEY_VARIABLE)
        self._timeout_s, self._retry = timeout_s, retry
        self._client = AsyncClient(self.base_url, self._key, timeout_s=timeout_s, retry=retry, http=http)

    async def close(self) -> None:
        """Close the connections this client opened."""
        await self._client.close()

    async def __aenter__(self) -> AsyncPlatform:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _send(self, call: Call[T]) -> T:
        return await self._client._send(call)

    async def whoami(self) -> models.PlatformInfo:
        """The key's platform and scopes."""
        return await self._send(calls.platform())

    def acting_for(self, account_id: str) -> AsyncClient:
        """An `AsyncClient` for one of the platform's accounts: every call names it in `Vidjobs-Account` (the key
        needs the `act` scope). It opens connections of its own: use it as an async context manager, or close it."""
        return AsyncClient(self.base_url, self._key, timeout_s=self._timeout_s, retry=self._retry,
                           account_id=account_id)

    # Accounts

    async def create_account(self, external_id: str, *, name: str = "", plan: str | None = None,
                       **limits: Unpack[models.AccountLimits]) -> models.PlatformAccount:
        """The account of your user `external_id`, made now (named `name`, else the id; with a plan's limits,
        and `limits` over them), or the one made for it before, unchanged: safe to call on every sign-in."""
        return await self._send(calls.create_platform_account(external_id, name, plan, limits))

    async def get_account(self, account_id: str) -> models.PlatformAccount:
        """One of your accounts: its plan, status, credit and limits."""
        return await self._send(calls.get_platform_account(account_id))

    async def list_accounts(self, cursor: str | None = None, *, external_id: str | None = None,
                      limit: int | None = None) -> models.PlatformAccountPage:
        """One page of your accounts, oldest first (`external_id`: only that user's); pass `next_cursor` for the
        next."""
        return await self._send(calls.list_platform_accounts(external_id, limit, cursor))

    async def iter_accounts(self, *, external_id: str | None = None, limit: int | None = None,
                            ) -> AsyncIterator[models.PlatformAccount]:
        """Every account, oldest first, fetching pages (of `limit`) as they are needed."""
        cursor = None
        while True:
            page = await self.list_accounts(cursor, external_id=external_id, limit=limit)
            for item in page.data:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def update_account(self, account_id: str, *, name: str | None = None, plan: str | None = None,
                       **limits: Unpack[models.AccountLimits]) -> models.PlatformAccount:
        """Change what is named: a plan sets the limits it carries; a limit given (None clears a cap) is the
        account's own and, without a plan, takes it off its plan."""
        return await self._send(calls.update_platform_account(account_id, name, plan, limits))

    async def disable_account(self, account_id: str, *, running: Literal["finish", "stop"] = "finish",
                        reason: str = "") -> models.DisabledAccount:
        """Stop the account creating jobs: its waiting jobs are canceled, its running ones finish (or, with
        `running="stop"`, are stopped too). It still reads; `enable_account` undoes it."""
        return await self._send(calls.disable_platform_account(account_id, running, reason))

    async def enable_account(self, account_id: str) -> models.PlatformAccount:
        """Let a disabled account create jobs again."""
        return await self._send(calls.enable_platform_account(account_id))

    async def delete_account(self, account_id: str) -> models.DeletedAccount:
        """Close the account now (keys revoked, live jobs canceled); its data is then removed."""
        return await self._send(calls.delete_platform_account(account_id))

    # Credit

    async def grant_credits(self, account_id: str, amount: int, *, idempotency_key: str,
                      reason: str = "") -> models.CreditChange:
        """Add credit once per `idempotency_key` (your billing provider's event id): sent again, the first
        change is answered (`replayed`); the key used for another change raises `Conflict`."""
        return await self._send(calls.change_credit(account_id, "grant", amount, idempotency_key, reason))

    async def take_back_credits(self, account_id: str, amount: int, *, idempotency_key: str,
                          reason: str = "") -> models.CreditChange:
        """Take credit back (a refund), once per `idempotency_key`; `Conflict` if it would leave less than the
        account has reserved for its running jobs."""
        return await self._send(calls.change_credit(account_id, "take_back", amount, idempotency_key, reason))

    async def ledger(self, account_id: str, *, limit: int | None = None,
                     cursor: str | None = None) -> models.LedgerPage:
        """One page of an account's credit ledger, newest first."""
        return await self._send(calls.platform_ledger(account_id, limit, cursor))

    async def usage(self, account_id: str, *, group_by: str | None = None, start: datetime | None = None,
                    end: datetime | None = None) -> models.Usage:
        """An account's jobs created in [start, end), grouped as `Client.usage` groups them."""
        return await self._send(calls.platform_usage(account_id, group_by, start, end))

    # Keys and browser tokens

    async def create_key(self, account_id: str, *, name: str = "") -> models.NewApiKey:
        """A new API key for an account; its `key` is in this answer only."""
        return await self._send(calls.create_account_key(account_id, name))

    async def list_keys(self, account_id: str) -> list[models.ApiKey]:
        """An account's API keys, described (never the keys)."""
        return (await self._send(calls.list_account_keys(account_id))).data

    async def revoke_key(self, account_id: str, key_id: str) -> None:
        """Revoke one of an account's API keys (the browser tokens it issued die with it)."""
        await self._send(calls.revoke_account_key(account_id, key_id))

    async def create_token(self, account_id: str, *, scopes: list[str] | None = None,
                           jobs: list[str] | None = None, ttl_s: int | None = None,
                           credit_ceiling: int | None = None) -> models.BrowserToken:
        """A short-lived browser token for one of your accounts, as `Client.create_token` makes one."""
        return await self._send(calls.create_account_token(account_id, scopes, jobs, ttl_s, credit_ceiling))

    # Plans and the audit trail

    async def put_plan(self, name: str, **limits: Unpack[models.PlanLimits]) -> models.Plan:
        """Make or change a plan; every account on it takes its limits at once."""
        return await self._send(calls.put_plan(name, limits))

    async def list_plans(self) -> list[models.Plan]:
        """Your plans, by name."""
        return (await self._send(calls.list_plans())).data

    async def audit(self, *, account_id: str | None = None, limit: int | None = None,
                    cursor: str | None = None) -> models.AuditPage:
        """One page of what your platform keys changed (and did for accounts), newest first."""
        return await self._send(calls.audit(account_id, limit, cursor))

    async def iter_audit(self, *, account_id: str | None = None, limit: int | None = None,
                         ) -> AsyncIterator[models.AuditEntry]:
        """The whole audit trail (or one account's), newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = await self.audit(account_id=account_id, limit=limit, cursor=cursor)
            for item in page.data:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor


def _restart(out: BinaryIO) -> None:
    out.seek(0)
    out.truncate()
