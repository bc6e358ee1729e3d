"""Each API operation as a value: method, path, query, body and the type its answer decodes to.

The sync and async clients send the same `Call`s, so what an operation is lives here once and each client only
moves bytes. `replayable` says whether sending a call twice does no harm, which decides whether it may be
retried after a connection broke mid-request.
"""

from __future__ import annotations

import mimetypes
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import msgspec

from . import models
from .errors import APIError, UploadRejected, WaitTimeout, error_class

T = TypeVar("T")
Query = list[tuple[str, str | int | float | bool | None]]  # as httpx takes it
_IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    answer: type[T] | None  # None: the answer has no body (204, 202)
    query: Query = field(default_factory=list)
    body: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    replayable: bool = True


def decode(call: Call[T], content: bytes) -> T:
    if call.answer is None:
        return None  # type: ignore[return-value]  # a Call[None] by construction
    return msgspec.json.decode(content, type=call.answer)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    try:
        return max(0.0, float(headers["Retry-After"]))
    except (KeyError, ValueError):
        return None


def api_error(status: int, headers: Mapping[str, str], content: bytes) -> APIError:
    """The API's error answer as an exception; an answer that is not the API's JSON still becomes one."""
    try:
        body = msgspec.json.decode(content, type=dict[str, Any])["error"]
        code, message = str(body["code"]), str(body["message"])
        retryable, request_id = bool(body.get("retryable")), body.get("request_id")
    except (msgspec.DecodeError, KeyError, TypeError):
        code, message = "http_error", content[:200].decode(errors="replace").strip() or f"HTTP {status}"
        retryable, request_id = status in (429, 502, 503, 504), None
    return error_class(status)(status, code, message, retryable=retryable,
                               request_id=request_id or headers.get("X-Request-Id"),
                               retry_after_s=retry_after_s(headers))


def _json(value: object) -> bytes:
    return msgspec.json.encode(value)


def _time(value: datetime | str) -> str:
    return value.isoformat() if isinstance(value, datetime) else value


def _job(job_id: str) -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}"


def new_idempotency_key() -> str:
    return "idem_" + secrets.token_hex(16)


def create_job(model: str, prompt: str, options: models.JobOptions, idempotency_key: str | None) -> Call[models.Job]:
    # A generated key makes a create safe to send again after a lost answer: the API answers the same job.
    key = idempotency_key or new_idempotency_key()
    return Call("POST", "/v1/jobs", models.Job, body=_json({"model": model, "prompt": prompt, **options}),
                headers={"Content-Type": "application/json", "Idempotency-Key": key})


def estimate(model: str, prompt: str, options: models.JobOptions) -> Call[models.Estimate]:
    return Call("POST", "/v1/estimates", models.Estimate, body=_json({"model": model, "prompt": prompt, **options}),
                headers={"Content-Type": "application/json"})


def get_job(job_id: str) -> Call[models.Job]:
    return Call("GET", _job(job_id), models.Job)


def list_jobs(filters: models.ListFilter, cursor: str | None = None) -> Call[models.JobPage]:
    query: Query = []
    if "status" in filters:
        status = filters["status"]
        query.append(("status", status if isinstance(status, str) else ",".join(status)))
    if "model" in filters:
        query.append(("model", filters["model"]))
    for name in ("created_after", "created_before"):
        if name in filters:
            query.append((name, _time(filters[name])))
    query += [(f"metadata.{key}", value) for key, value in filters.get("metadata", {}).items()]
    if "limit" in filters:
        query.append(("limit", str(filters["limit"])))
    if cursor:
        query.append(("cursor", cursor))
    return Call("GET", "/v1/jobs", models.JobPage, query=query)


def cancel_job(job_id: str) -> Call[models.Job]:
    return Call("POST", _job(job_id) + "/cancel", models.Job)  # cancelling twice is cancelling once


def rerun_job(job_id: str, idempotency_key: str | None) -> Call[models.Job]:
    # Keyed like a create: a rerun sent again after a lost answer answers the same new job.
    return Call("POST", _job(job_id) + "/rerun", models.Job,
                headers={"Idempotency-Key": idempotency_key or new_idempotency_key()})


def delete_job(job_id: str) -> Call[None]:
    return Call("DELETE", _job(job_id), None)


def keep_job(job_id: str) -> Call[models.Job]:
    return Call("POST", _job(job_id) + "/keep", models.Job)  # keeping a kept clip leaves it kept


def release_job(job_id: str) -> Call[models.Job]:
    return Call("DELETE", _job(job_id) + "/keep", models.Job)  # releasing a released clip changes nothing


def export_job(job_id: str, url: str) -> Call[models.Export]:
    # Not replayable: the API takes no idempotency key here, so a POST sent again after a lost answer starts a
    # second export: the clip PUT to the bucket a second time, and a second of the account's exports in flight.
    return Call("POST", _job(job_id) + "/export", models.Export, body=_json({"url": url}),
                headers={"Content-Type": "application/json"}, replayable=False)


def get_export(job_id: str, export_id: str) -> Call[models.Export]:
    return Call("GET", f"{_job(job_id)}/exports/{quote(export_id, safe='')}", models.Export)


def list_exports(job_id: str) -> Call[models.ExportList]:
    return Call("GET", _job(job_id) + "/exports", models.ExportList)


def export_pauses(export: models.Export, timeout_s: float | None) -> Iterator[float]:
    """Seconds between asking about a pending export: soon at first (a small clip is copied in about a
    second), then at most every five seconds (a failed try waits out a backoff of up to a minute anyway)."""
    return _pauses(0.5, 5.0, timeout_s, f"export {export.id} was still pending")


def job_events(job_id: str) -> Call[models.Trail]:
    return Call("GET", _job(job_id) + "/events", models.Trail)


def stream_path(job_id: str) -> str:
    return _job(job_id) + "/stream"


def image_type(path: Path) -> str:
    return _IMAGE_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def upload(image: bytes, content_type: str) -> Call[models.Upload]:
    # Not replayable: a second upload is a second stored image (and counts against the daily cap).
    return Call("POST", "/v1/uploads", models.Upload, body=image, headers={"Content-Type": content_type},
                replayable=False)


def get_upload(upload_id: str) -> Call[models.Upload]:
    return Call("GET", f"/v1/uploads/{quote(upload_id, safe='')}", models.Upload)


def upload_pauses(upload: models.Upload, timeout_s: float | None) -> Iterator[float]:
    """Seconds between asking about a processing upload: soon at first (decoding takes about a second),
    then at most every two seconds."""
    return _pauses(0.2, 2.0, timeout_s, f"upload {upload.id} was still processing")


def _pauses(first: float, most: float, timeout_s: float | None, still: str) -> Iterator[float]:
    """The pauses of one wait, growing from `first` to `most`; `WaitTimeout` instead of one that would end
    past `timeout_s` from now."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    delay = first
    while True:
        if deadline is not None and time.monotonic() + delay > deadline:
            raise WaitTimeout(f"{still} after {timeout_s} s")
        yield delay
        delay = min(delay * 1.5, most)


def settled(upload: models.Upload) -> models.Upload:
    """A decided upload, or UploadRejected when the server refused its image."""
    if upload.status == "rejected":
        error = upload.error or models.UploadError(code="image_corrupt", message="the image was rejected")
        raise UploadRejected(upload.id, error.code, error.message)
    return upload


def account() -> Call[models.Account]:
    return Call("GET", "/v1/account", models.Account)


def set_fallback_models(fallback_models: list[str]) -> Call[models.Account]:
    # Setting the same list twice leaves the same account: safe to repeat.
    return Call("PATCH", "/v1/account", models.Account, body=_json({"fallback_models": fallback_models}),
                headers={"Content-Type": "application/json"})


def ledger(limit: int | None = None, cursor: str | None = None) -> Call[models.LedgerPage]:
    query: Query = [("limit", str(limit))] if limit else []
    return Call("GET", "/v1/account/ledger", models.LedgerPage, query=query + ([("cursor", cursor)] if cursor else []))


def usage(group_by: str | None = None, start: datetime | None = None, end: datetime | None = None,
          ) -> Call[models.Usage]:
    query: Query = [(name, value) for name, value in (
        ("group_by", group_by), ("from", start.isoformat() if start else None),
        ("to", end.isoformat() if end else None)) if value is not None]
    return Call("GET", "/v1/account/usage", models.Usage, query=query)


def webhook_secret() -> Call[models.WebhookSecret]:
    return Call("GET", "/v1/account/webhook-secret", models.WebhookSecret)


def _overlap(overlap_s: int | None) -> bytes:
    return _json({} if overlap_s is None else {"overlap_s": overlap_s})


def create_webhook_secret(overlap_s: int | None) -> Call[models.NewWebhookSecret]:
    # Not replayable: a second one replaces the first, whose answer (the only time it is shown) was lost.
    return Call("POST", "/v1/account/webhook-secret", models.NewWebhookSecret, body=_overlap(overlap_s),
                headers={"Content-Type": "application/json"}, replayable=False)


def list_models() -> Call[models.ModelList]:
    return Call("GET", "/v1/models", models.ModelList)


def create_webhook_endpoint(url: str, events: list[str] | None, description: str) -> Call[models.WebhookEndpoint]:
    body: dict[str, object] = {"url": url, "description": description}
    if events is not None:
        body["events"] = events
    return Call("POST", "/v1/webhook-endpoints", models.WebhookEndpoint, body=_json(body),
                headers={"Content-Type": "application/json"}, replayable=False)


def list_webhook_endpoints() -> Call[models.EndpointList]:
    return Call("GET", "/v1/webhook-endpoints", models.EndpointList)


def _endpoint(endpoint_id: str) -> str:
    return f"/v1/webhook-endpoints/{quote(endpoint_id, safe='')}"


def rotate_webhook_endpoint_secret(endpoint_id: str, overlap_s: int | None) -> Call[models.NewWebhookSecret]:
    return Call("POST", _endpoint(endpoint_id) + "/rotate-secret", models.NewWebhookSecret, body=_overlap(overlap_s),
                headers={"Content-Type": "application/json"}, replayable=False)


def delete_webhook_endpoint(endpoint_id: str) -> Call[None]:
    return Call("DELETE", _endpoint(endpoint_id), None)


def deliveries(endpoint_id: str, cursor: str | None = None) -> Call[models.DeliveryList]:
    query: Query = [("cursor", cursor)] if cursor else []
    return Call("GET", _endpoint(endpoint_id) + "/deliveries", models.DeliveryList, query=query)


def retry_delivery(endpoint_id: str, delivery_id: str) -> Call[None]:
    return Call("POST", f"{_endpoint(endpoint_id)}/deliveries/{quote(delivery_id, safe='')}/retry", None)


_JSON = {"Content-Type": "application/json"}


def _token(scopes: list[str] | None, jobs: list[str] | None, ttl_s: int | None, credit_ceiling: int | None) -> bytes:
    """A token's body: what is left out takes the API's default (read, every job, 900 s, no ceiling)."""
    body = {"scopes": scopes, "jobs": jobs, "ttl_s": ttl_s, "credit_ceiling": credit_ceiling}
    return _json({name: value for name, value in body.items() if value is not None})


def create_token(scopes: list[str] | None, jobs: list[str] | None, ttl_s: int | None,
                 credit_ceiling: int | None) -> Call[models.BrowserToken]:
    # Not replayable: a second token would be made, and the first (shown once) was lost with its answer.
    return Call("POST", "/v1/account/tokens", models.BrowserToken, body=_token(scopes, jobs, ttl_s, credit_ceiling),
                headers=_JSON, replayable=False)


# The platform's calls (a platform key, `vidjobs_client.Platform`).

def _account(account_id: str) -> str:
    return f"/v1/platform/accounts/{quote(account_id, safe='')}"


def _page(limit: int | None, cursor: str | None, **more: str | None) -> Query:
    pairs: Query = [(name, value) for name, value in more.items() if value is not None]
    return pairs + ([("limit", str(limit))] if limit else []) + ([("cursor", cursor)] if cursor else [])


def platform() -> Call[models.PlatformInfo]:
    return Call("GET", "/v1/platform", models.PlatformInfo)


def create_platform_account(external_id: str, name: str, plan: str | None,
                            limits: models.AccountLimits) -> Call[models.PlatformAccount]:
    # Made again with the same external_id, the account made first is answered: safe to send again.
    body: dict[str, object] = {"external_id": external_id, **limits}
    if name:
        body["name"] = name
    if plan is not None:
        body["plan"] = plan
    return Call("POST", "/v1/platform/accounts", models.PlatformAccount, body=_json(body), headers=_JSON)


def list_platform_accounts(external_id: str | None, limit: int | None,
                           cursor: str | None) -> Call[models.PlatformAccountPage]:
    return Call("GET", "/v1/platform/accounts", models.PlatformAccountPage,
                query=_page(limit, cursor, external_id=external_id))


def get_platform_account(account_id: str) -> Call[models.PlatformAccount]:
    return Call("GET", _account(account_id), models.PlatformAccount)


def update_platform_account(account_id: str, name: str | None, plan: str | None,
                            limits: models.AccountLimits) -> Call[models.PlatformAccount]:
    body: dict[str, object] = {**limits}
    if name is not None:
        body["name"] = name
    if plan is not None:
        body["plan"] = plan
    return Call("PATCH", _account(account_id), models.PlatformAccount, body=_json(body), headers=_JSON)


def disable_platform_account(account_id: str, running: str, reason: str) -> Call[models.DisabledAccount]:
    return Call("POST", _account(account_id) + "/disable", models.DisabledAccount,
                body=_json({"running": running, "reason": reason}), headers=_JSON)


def enable_platform_account(account_id: str) -> Call[models.PlatformAccount]:
    return Call("POST", _account(account_id) + "/enable", models.PlatformAccount)


def delete_platform_account(account_id: str) -> Call[models.DeletedAccount]:
    return Call("DELETE", _account(account_id), models.DeletedAccount)


def change_credit(account_id: str, action: str, amount: int, idempotency_key: str,
                  reason: str) -> Call[models.CreditChange]:
    # The idempotency key makes it one change however often it is sent: safe to send again.
    body = {"action": action, "amount": amount, "idempotency_key": idempotency_key, "reason": reason}
    return Call("POST", _account(account_id) + "/credits", models.CreditChange, body=_json(body), headers=_JSON)


def platform_ledger(account_id: str, limit: int | None, cursor: str | None) -> Call[models.LedgerPage]:
    return Call("GET", _account(account_id) + "/ledger", models.LedgerPage, query=_page(limit, cursor))


def platform_usage(account_id: str, group_by: str | None, start: datetime | None,
                   end: datetime | None) -> Call[models.Usage]:
    return Call("GET", _account(account_id) + "/usage", models.Usage, query=usage(group_by, start, end).query)


def create_account_key(account_id: str, name: str) -> Call[models.NewApiKey]:
    # Not replayable: a second key would be made, and the first (shown once) was lost with its answer.
    return Call("POST", _account(account_id) + "/keys", models.NewApiKey, body=_json({"name": name}),
                headers=_JSON, replayable=False)


def list_account_keys(account_id: str) -> Call[models.ApiKeyList]:
    return Call("GET", _account(account_id) + "/keys", models.ApiKeyList)


def revoke_account_key(account_id: str, key_id: str) -> Call[None]:
    return Call("DELETE", f"{_account(account_id)}/keys/{quote(key_id, safe='')}", None)


def create_account_token(account_id: str, scopes: list[str] | None, jobs: list[str] | None, ttl_s: int | None,
                         credit_ceiling: int | None) -> Call[models.BrowserToken]:
    return Call("POST", _account(account_id) + "/tokens", models.BrowserToken,
                body=_token(scopes, jobs, ttl_s, credit_ceiling), headers=_JSON, replayable=False)


def put_plan(name: str, limits: models.PlanLimits) -> Call[models.Plan]:
    # A PUT: the same plan sent twice is the same plan.
    return Call("PUT", f"/v1/platform/plans/{quote(name, safe='')}", models.Plan, body=_json(limits),
                headers=_JSON)


def list_plans() -> Call[models.PlanList]:
    return Call("GET", "/v1/platform/plans", models.PlanList)


def audit(account_id: str | None, limit: int | None, cursor: str | None) -> Call[models.AuditPage]:
    return Call("GET", "/v1/platform/audit", models.AuditPage, query=_page(limit, cursor, account_id=account_id))
