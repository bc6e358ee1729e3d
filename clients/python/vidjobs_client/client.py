"""The synchronous client. `vidjobs_client.aio.AsyncClient` has the same methods, awaitable."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


class Client:
    """A connection to the vidjobs API.

    `base_url` and `api_key` default to `VIDJOBS_URL` and `VIDJOBS_API_KEY`. With a platform key (`vjp_...`) and
    `account_id`, it calls the account's routes for one of the platform's accounts (`Platform.acting_for`).
    Refusals the API marks retryable (429, 503) and connections that fail are retried as `retry` says; anything
    else raises an `APIError` whose `code` is the API's error code. Use it as a context manager, or call `close()`.
    """

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.Client | None = None,
                 account_id: str | None = None) -> None:
        self.base_url, self._key = connection.resolve(base_url, api_key)
        self.account_id = account_id
        self._retry = retry or RetryPolicy()
        self._http = http or httpx.Client(base_url=self.base_url, timeout=timeout_s,
                                          headers={"User-Agent": connection.USER_AGENT})

    def close(self) -> None:
        """Close the connections this client opened."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        headers = connection.request_headers(call, self._key, self.account_id)
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self._http.request(call.method, call.path, params=call.query, content=call.body,
                                          headers=headers)
            except httpx.TransportError as exc:
                wait = self._retry.after_failure(call, attempt, exc)
            else:
                if resp.is_success:
                    return decode(call, resp.content)
                wait = self._retry.after_refusal(call, attempt, api_error(resp.status_code, resp.headers,
                                                                          resp.content))
            time.sleep(wait)

    # Jobs

    def create_job(self, model: str, prompt: str, *, idempotency_key: str | None = None,
                   **options: Unpack[models.JobOptions]) -> models.Job:
        """Create a render job. An idempotency key is generated unless given, so a retried create never
        makes a second job. `priority="batch"` queues it behind the account's waiting interactive jobs."""
        return self._send(calls.create_job(model, prompt, options, idempotency_key))

    def estimate(self, model: str, prompt: str, **options: Unpack[models.JobOptions]) -> models.Estimate:
        """What creating this job would reserve, checked as a create is, without creating anything."""
        return self._send(calls.estimate(model, prompt, options))

    def get_job(self, job_id: str) -> models.Job:
        """One job, as it stands."""
        return self._send(calls.get_job(job_id))

    def list_jobs(self, cursor: str | None = None, **filters: Unpack[models.ListFilter]) -> models.JobPage:
        """One page of the account's jobs, newest first; pass `next_cursor` for the next."""
        return self._send(calls.list_jobs(filters, cursor))

    def iter_jobs(self, **filters: Unpack[models.ListFilter]) -> Iterator[models.Job]:
        """Every job that matches, newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = self.list_jobs(cursor, **filters)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel_job(self, job_id: str) -> models.Job:
        """Cancel a job; one already finished is answered unchanged."""
        return self._send(calls.cancel_job(job_id))

    def rerun_job(self, job_id: str, *, idempotency_key: str | None = None) -> models.Job:
        """Render a job's request again as a new job (its `rerun_of` names the original). An idempotency key
        is generated unless given, so a retried rerun never makes a second job."""
        return self._send(calls.rerun_job(job_id, idempotency_key))

    def delete_job(self, job_id: str) -> None:
        """Delete a job and its files."""
        self._send(calls.delete_job(job_id))

    def job_events(self, job_id: str) -> list[models.Transition]:
        """The job's audit trail, oldest first."""
        return self._send(calls.job_events(job_id)).data

    def stream_job(self, job_id: str, *, timeout_s: float | None = None) -> Iterator[models.Job]:
        """The job now and at every change until it finishes, reconnecting when the connection drops.

        Raises `WaitTimeout` if it has not finished within `timeout_s`."""
        follower = Follower(job_id, self._retry)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                yield from self._connection(follower, deadline)
                return
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} did not finish within {timeout_s} s") from exc
                wait = follower.dropped(exc)
            except StreamEnded:
                wait = follower.dropped(None)
            except StreamRefused as refused:
                wait = follower.refused(refused.error)
            time.sleep(wait)

    def _connection(self, follower: Follower, deadline: float | None) -> Iterator[models.Job]:
        """Events of one connection; returns when the job finished, raises `StreamEnded` if the stream ended first."""
        read_s = READ_TIMEOUT_S if deadline is None else max(0.01, min(READ_TIMEOUT_S, deadline - time.monotonic()))
        timeout = httpx.Timeout(self._http.timeout.connect, read=read_s)
        headers = {**connection.request_headers(follower.call, self._key, self.account_id),
                   "Accept": "text/event-stream"}
        with self._http.stream("GET", follower.call.path, headers=headers, timeout=timeout) as resp:
            if not resp.is_success:
                raise StreamRefused(api_error(resp.status_code, resp.headers, resp.read()))
            follower.connected()
            for line in resp.iter_lines():
                if (job := follower.line(line)) is not None:
                    yield job
                    if job.finished:
                        return
        raise StreamEnded

    def wait(self, job_id: str, *, timeout_s: float | None = None,
             on_change: Callable[[models.Job], None] | None = None) -> models.Job:
        """Follow the job until it finishes and return it as it ended (completed, failed, canceled or
        expired). `on_change` sees every state on the way."""
        for job in self.stream_job(job_id, timeout_s=timeout_s):
            if on_change is not None:
                on_change(job)
            if job.finished:
                return job
        raise AssertionError("the stream ends only with a finished job")

    def download(self, job: models.Job | str, dest: str | Path | None = None, *, part: Part = "video",
                 on_progress: Callable[[int, int | None], None] | None = None) -> Path:
        """Save the job's video (or `part="thumbnail"` / `"preview"`) to `dest` (a file, or a folder for
        `<job id>.mp4`) and return its path. The video is checked against the job's sha256 and size; a
        mismatch raises `ChecksumMismatch` and keeps nothing."""
        job = self.get_job(job) if isinstance(job, str) else job
        load = Download(job, part, target_path(job, dest, part))
        with load.partial.open("wb") as out:
            self._fetch(load, out, on_progress)
        load.check()
        load.partial.replace(load.target)
        return load.target

    def _fetch(self, load: Download, out: BinaryIO, on_progress: Callable[[int, int | None], None] | None) -> None:
        url, attempt = source(load.job, load.part), 0
        while True:
            attempt += 1
            try:
                with self._http.stream("GET", url, headers=load.range_header()) as resp:
                    if resp.status_code in (401, 403, 404) and not load.refreshed:
                        load.refreshed, url = True, source(self.get_job(load.job.id), load.part)
                        continue  # a signed URL that expired: read the job for fresh ones
                    if not resp.is_success:
                        raise api_error(resp.status_code, resp.headers, resp.read())
                    if not load.answered(resp.status_code, resp.headers.get("Content-Length")):
                        out.seek(0)
                        out.truncate()
                    for chunk in resp.iter_bytes(CHUNK):
                        out.write(chunk)
                        load.add(chunk)
                        if on_progress is not None:
                            on_progress(load.written, load.total)
                return
            except httpx.TransportError as exc:
                time.sleep(self._retry.after_failure(Call("GET", url, None), attempt, exc))

    # Keeping and exporting clips

    def keep_job(self, job_id: str) -> models.Job:
        """Keep a ready job's clip past retention (`outputs.kept`), counted against the account's storage quota.
        `Conflict` with code `conflict` if the job is not ready, `storage_quota_exceeded` past the quota."""
        return self._send(calls.keep_job(job_id))

    def release_job(self, job_id: str) -> models.Job:
        """Stop keeping the job's clip: retention counts from its completion again (`outputs.retained_until`)."""
        return self._send(calls.release_job(job_id))

    def export_job(self, job_id: str, url: str, *, wait: bool = False,
                   timeout_s: float | None = 600.0) -> models.Export:
        """Copy a ready job's stored original to `url`, a presigned PUT URL of your own bucket (`Conflict` if the
        job is not ready). The copy is made after answering: it is returned pending unless `wait`, which asks
        until it is done or failed (see `reason`), or raises `WaitTimeout` past `timeout_s`."""
        export = self._send(calls.export_job(job_id, url))
        return self.wait_export(export, timeout_s=timeout_s) if wait else export

    def wait_export(self, export: models.Export, *, timeout_s: float | None = 600.0) -> models.Export:
        """Ask about an export until it is done or failed (see `reason`); `WaitTimeout` past `timeout_s`."""
        current, pauses = export, calls.export_pauses(export, timeout_s)
        while current.pending:
            time.sleep(next(pauses))
            current = self.get_export(current.job_id, current.id)
        return current

    def get_export(self, job_id: str, export_id: str) -> models.Export:
        """One export of the job, as it stands: pending, done or failed."""
        return self._send(calls.get_export(job_id, export_id))

    def list_exports(self, job_id: str) -> list[models.Export]:
        """The job's exports, newest first (the last 20)."""
        return self._send(calls.list_exports(job_id)).data

    # Uploads, account, models, webhooks

    def upload(self, image: str | Path | bytes, content_type: str | None = None, *, wait: bool = True,
               timeout_s: float | None = 120.0) -> models.Upload:
        """Upload a PNG, JPEG or WebP image; name its id as a job's `input_image`. The server decodes it after
        answering: by default this waits until it is ready (`UploadRejected` if the image was refused,
        `WaitTimeout` past `timeout_s`); `wait=False` returns it still processing (see `wait_upload`)."""
        if isinstance(image, bytes):
            upload = self._send(calls.upload(image, content_type or "application/octet-stream"))
        else:
            path = Path(image)
            upload = self._send(calls.upload(path.read_bytes(), content_type or calls.image_type(path)))
        return self.wait_upload(upload, timeout_s=timeout_s) if wait else upload

    def get_upload(self, upload_id: str) -> models.Upload:
        """The upload as it stands: processing, ready or rejected (with `error`)."""
        return self._send(calls.get_upload(upload_id))

    def wait_upload(self, upload: models.Upload | str, *, timeout_s: float | None = 120.0) -> models.Upload:
        """The upload once decoded and ready; raises `UploadRejected` or `WaitTimeout`."""
        current = self.get_upload(upload) if isinstance(upload, str) else upload
        pauses = calls.upload_pauses(current, timeout_s)
        while current.processing:
            time.sleep(next(pauses))
            current = self.get_upload(current.id)
        return calls.settled(current)

    def account(self) -> models.Account:
        """The account: credit, limits in force and jobs under way."""
        return self._send(calls.account())

    def set_fallback_models(self, fallback_models: list[str]) -> models.Account:
        """The account's default fallback models, for its jobs that name none ([] for none)."""
        return self._send(calls.set_fallback_models(fallback_models))

    def create_token(self, *, scopes: list[str] | None = None, jobs: list[str] | None = None,
                     ttl_s: int | None = None, credit_ceiling: int | None = None) -> models.BrowserToken:
        """A short-lived browser token for this account, to hand to one of its people's browsers: `scopes` of
        read (the default), create and upload; only `jobs` (and those it creates), else every job; `ttl_s` of
        60-3600 (default 900); with create, a `credit_ceiling` on what its jobs reserve together."""
        return self._send(calls.create_token(scopes, jobs, ttl_s, credit_ceiling))

    def ledger(self, *, limit: int | None = None, cursor: str | None = None) -> models.LedgerPage:
        """One page of the account's credit ledger, newest first."""
        return self._send(calls.ledger(limit, cursor))

    def usage(self, *, group_by: str | None = None, start: datetime | None = None,
              end: datetime | None = None) -> models.Usage:
        """The account's jobs created in [start, end) (default: the last 30 days), grouped by `model`, `day`
        (UTC, the default) or `metadata.<key>`: jobs by status, credits charged and held, seconds delivered."""
        return self._send(calls.usage(group_by, start, end))

    def list_models(self) -> list[models.Model]:
        """The models this deployment renders with, what each takes and its price."""
        return self._send(calls.list_models()).data

    def webhook_secret(self) -> models.WebhookSecret:
        """When the secret that signs deliveries to the `webhook_url` a job names was made (not the secret)."""
        return self._send(calls.webhook_secret())

    def create_webhook_secret(self, *, overlap_s: int | None = None) -> models.NewWebhookSecret:
        """Make the account's webhook secret, or replace it (the old one signs too for `overlap_s`, default a
        day); its `secret` is in this answer only."""
        return self._send(calls.create_webhook_secret(overlap_s))

    def create_webhook_endpoint(self, url: str, *, events: list[str] | None = None,
                                description: str = "") -> models.WebhookEndpoint:
        """Register an endpoint of your app; its `secret` is in this answer only."""
        return self._send(calls.create_webhook_endpoint(url, events, description))

    def list_webhook_endpoints(self) -> list[models.WebhookEndpoint]:
        """Your webhook endpoints, oldest first."""
        return self._send(calls.list_webhook_endpoints()).data

    def rotate_webhook_endpoint_secret(self, endpoint_id: str, *,
                                       overlap_s: int | None = None) -> models.NewWebhookSecret:
        """Replace an endpoint's secret (the old one signs too for `overlap_s`, default a day); the new `secret`
        is in this answer only."""
        return self._send(calls.rotate_webhook_endpoint_secret(endpoint_id, overlap_s))

    def delete_webhook_endpoint(self, endpoint_id: str) -> None:
        """Remove an endpoint; nothing more is sent to it."""
        self._send(calls.delete_webhook_endpoint(endpoint_id))

    def deliveries(self, endpoint_id: str, cursor: str | None = None) -> models.DeliveryList:
        """One page of what was delivered to an endpoint, newest first, each with its last attempts; pass
        `next_cursor` for the next."""
        return self._send(calls.deliveries(endpoint_id, cursor))

    def iter_deliveries(self, endpoint_id: str) -> Iterator[models.Delivery]:
        """Everything delivered to an endpoint, newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = self.deliveries(endpoint_id, cursor)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def retry_delivery(self, endpoint_id: str, delivery_id: str) -> None:
        """Send a delivery again now."""
        self._send(calls.retry_delivery(endpoint_id, delivery_id))


class Platform:
    """A product's backend managing its users' accounts with a platform key (`vjp_...`).

    `base_url` and `platform_key` default to `VIDJOBS_URL` and `VIDJOBS_PLATFORM_KEY`. Retries and errors are a
    `Client`'s: an `APIError` (`NotFound`, `Conflict` ...) carries the API's code. A platform reaches only the
    accounts it made, each keyed by the product's own id of its user (`external_id`); `acting_for` gives a
    `Client` that calls one account's own routes (jobs, uploads ...) for it. Use it as a context manager, or call
    `close()`.
    """

    def __init__(self, base_url: str | None = None, platform_key: str | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, http: httpx.Client | None = None) -> None:
        self.base_url, self._key = connection.resolve(base_url, platform_key, what="platform key",
                                                      argument="platform_key",
                                                      variable=connection.PLATFORM_KEY_VARIABLE)
        self._timeout_s, self._retry = timeout_s, retry
        self._client = Client(self.base_url, self._key, timeout_s=timeout_s, retry=retry, http=http)

    def close(self) -> None:
        """Close the connections this client opened."""
        self._client.close()

    def __enter__(self) -> Platform:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        return self._client._send(call)

    def whoami(self) -> models.PlatformInfo:
        """The key's platform and scopes."""
        return self._send(calls.platform())

    def acting_for(self, account_id: str) -> Client:
        """A `Client` for one of the platform's accounts: every call names it in `Vidjobs-Account` (the key needs
        the `act` scope). It opens connections of its own: use it as a context manager, or close it."""
        return Client(self.base_url, self._key, timeout_s=self._timeout_s, retry=self._retry, account_id=account_id)

    # Accounts

    def create_account(self, external_id: str, *, name: str = "", plan: str | None = None,
                       **limits: Unpack[models.AccountLimits]) -> models.PlatformAccount:
        """The account of your user `external_id`, made now (named `name`, else the id; with a plan's limits,
        and `limits` over them), or the one made for it before, unchanged: safe to call on every sign-in."""
        return self._send(calls.create_platform_account(external_id, name, plan, limits))

    def get_account(self, account_id: str) -> models.PlatformAccount:
        """One of your accounts: its plan, status, credit and limits."""
        return self._send(calls.get_platform_account(account_id))

    def list_accounts(self, cursor: str | None = None, *, external_id: str | None = None,
                      limit: int | None = None) -> models.PlatformAccountPage:
        """One page of your accounts, oldest first (`external_id`: only that user's); pass `next_cursor` for the
        next."""
        return self._send(calls.list_platform_accounts(external_id, limit, cursor))

    def iter_accounts(self, *, external_id: str | None = None, limit: int | None = None,
                      ) -> Iterator[models.PlatformAccount]:
        """Every account, oldest first, fetching pages (of `limit`) as they are needed."""
        cursor = None
        while True:
            page = self.list_accounts(cursor, external_id=external_id, limit=limit)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def update_account(self, account_id: str, *, name: str | None = None, plan: str | None = None,
                       **limits: Unpack[models.AccountLimits]) -> models.PlatformAccount:
        """Change what is named: a plan sets the limits it carries; a limit given (None clears a cap) is the
        account's own and, without a plan, takes it off its plan."""
        return self._send(calls.update_platform_account(account_id, name, plan, limits))

    def disable_account(self, account_id: str, *, running: Literal["finish", "stop"] = "finish",
                        reason: str = "") -> models.DisabledAccount:
        """Stop the account creating jobs: its waiting jobs are canceled, its running ones finish (or, with
        `running="stop"`, are stopped too). It still reads; `enable_account` undoes it."""
        return self._send(calls.disable_platform_account(account_id, running, reason))

    def enable_account(self, account_id: str) -> models.PlatformAccount:
        """Let a disabled account create jobs again."""
        return self._send(calls.enable_platform_account(account_id))

    def delete_account(self, account_id: str) -> models.DeletedAccount:
        """Close the account now (keys revoked, live jobs canceled); its data is then removed."""
        return self._send(calls.delete_platform_account(account_id))

    # Credit

    def grant_credits(self, account_id: str, amount: int, *, idempotency_key: str,
                      reason: str = "") -> models.CreditChange:
        """Add credit once per `idempotency_key` (your billing provider's event id): sent again, the first
        change is answered (`replayed`); the key used for another change raises `Conflict`."""
        return self._send(calls.change_credit(account_id, "grant", amount, idempotency_key, reason))

    def take_back_credits(self, account_id: str, amount: int, *, idempotency_key: str,
                          reason: str = "") -> models.CreditChange:
        """Take credit back (a refund), once per `idempotency_key`; `Conflict` if it would leave less than the
        account has reserved for its running jobs."""
        return self._send(calls.change_credit(account_id, "take_back", amount, idempotency_key, reason))

    def ledger(self, account_id: str, *, limit: int | None = None, cursor: str | None = None) -> models.LedgerPage:
        """One page of an account's credit ledger, newest first."""
        return self._send(calls.platform_ledger(account_id, limit, cursor))

    def usage(self, account_id: str, *, group_by: str | None = None, start: datetime | None = None,
              end: datetime | None = None) -> models.Usage:
        """An account's jobs created in [start, end), grouped as `Client.usage` groups them."""
        return self._send(calls.platform_usage(account_id, group_by, start, end))

    # Keys and browser tokens

    def create_key(self, account_id: str, *, name: str = "") -> models.NewApiKey:
        """A new API key for an account; its `key` is in this answer only."""
        return self._send(calls.create_account_key(account_id, name))

    def list_keys(self, account_id: str) -> list[models.ApiKey]:
        """An account's API keys, described (never the keys)."""
        return self._send(calls.list_account_keys(account_id)).data

    def revoke_key(self, account_id: str, key_id: str) -> None:
        """Revoke one of an account's API keys (the browser tokens it issued die with it)."""
        self._send(calls.revoke_account_key(account_id, key_id))

    def create_token(self, account_id: str, *, scopes: list[str] | None = None, jobs: list[str] | None = None,
                     ttl_s: int | None = None, credit_ceiling: int | None = None) -> models.BrowserToken:
        """A short-lived browser token for one of your accounts, as `Client.create_token` makes one."""
        return self._send(calls.create_account_token(account_id, scopes, jobs, ttl_s, credit_ceiling))

    # Plans and the audit trail

    def put_plan(self, name: str, **limits: Unpack[models.PlanLimits]) -> models.Plan:
        """Make or change a plan; every account on it takes its limits at once."""
        return self._send(calls.put_plan(name, limits))

    def list_plans(self) -> list[models.Plan]:
        """Your plans, by name."""
        return self._send(calls.list_plans()).data

    def audit(self, *, account_id: str | None = None, limit: int | None = None,
              cursor: str | None = None) -> models.AuditPage:
        """One page of what your platform keys changed (and did for accounts), newest first."""
        return self._send(calls.audit(account_id, limit, cursor))

    def iter_audit(self, *, account_id: str | None = None, limit: int | None = None) -> Iterator[models.AuditEntry]:
        """The whole audit trail (or one account's), newest first, fetching pages as they are needed."""
        cursor = None
        while True:
            page = self.audit(account_id=account_id, limit=limit, cursor=cursor)
            yield from page.data
            if not page.next_cursor:
                return
            cursor = page.next_cursor
