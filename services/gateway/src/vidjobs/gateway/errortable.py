"""Every error code, the HTTP statuses an answer carries it with, and what it means: docs/API.md's error table
is written from here (`apidoc`), and a test reads the gateway's code to hold each status it answers a code
with to this table (tests/test_error_table.py)."""

from __future__ import annotations

from typing import NamedTuple

from vidjobs.common.errors import DEFAULT_MESSAGES, RETRYABLE, ErrorCode
from vidjobs.gateway.apierrors import Code, GatewayCode


class Answer(NamedTuple):
    statuses: tuple[int, ...]  # the HTTP statuses of an error answer with this code
    when: str  # what the API answers it for


ANSWERS: dict[Code, Answer] = {
    ErrorCode.INVALID_INPUT: Answer((400, 422), (
        "400: the body is not JSON, a query parameter is repeated or malformed, the cursor or the "
        "`Idempotency-Key` is not one this API takes, or a provider callback is not one we understand; 422: a "
        "field breaks the schema or a rule (an unknown model, a duration it does not render, a missing upload), "
        "and the message names it")),
    GatewayCode.UNAUTHORIZED: Answer((401,), (
        "no credential, or one that is unknown, revoked or expired (an API key, a platform key, a browser "
        "token whose signature fails, whose time is up, or whose issuer's key was revoked); on the provider "
        "callback route, a signature that does not verify or a timestamp outside the tolerance")),
    ErrorCode.QUOTA_EXHAUSTED: Answer((402,), (
        "the account's free credit does not cover the job's estimate, or the job would pass its daily cap, its "
        "per-job maximum or the credit ceiling of the browser token it is created with")),
    GatewayCode.FORBIDDEN: Answer((403,), (
        "a live credential that may not call this route: a platform key without the scope the route needs (or "
        "acting for an account without `act`, or without naming it in `Vidjobs-Account`), an API key on a "
        "platform route, a browser token without the scope; or a signed file URL that was tampered with or has "
        "expired")),
    GatewayCode.ACCOUNT_DISABLED: Answer((403,), (
        "the account's platform disabled it: its jobs may be read, no job may be made until it is enabled")),
    GatewayCode.NOT_FOUND: Answer((404,), (
        "no such resource for this account; another account's answers exactly the same")),
    GatewayCode.METHOD_NOT_ALLOWED: Answer((405,), "the route does not take this method; `Allow` lists those it does"),
    GatewayCode.CONFLICT: Answer((409,), (
        "an `Idempotency-Key` used before with a different body, or for a job since deleted; a retry of a "
        "webhook delivery while one is under way; a rerun of a deleted job; keeping a job that is not "
        "completed; a credit change whose `idempotency_key` was used for another amount, or a take-back that "
        "would leave less than the account has reserved")),
    GatewayCode.UPLOAD_NOT_READY: Answer((409,), (
        "a job names an upload the media worker has not decoded yet (`retryable`, with `Retry-After`); "
        "`GET /v1/uploads/{id}` says when it is `ready`")),
    GatewayCode.UPLOAD_REJECTED: Answer((422,), (
        "a job names an upload whose image was rejected when decoded; the message and `GET /v1/uploads/{id}` "
        "say why")),
    GatewayCode.STORAGE_QUOTA_EXCEEDED: Answer((409,), (
        "keeping this clip would pass the account's storage quota; `GET /v1/account` shows `storage`: release "
        "a kept clip (`DELETE /v1/jobs/{id}/keep`) or export it first")),
    GatewayCode.PAYLOAD_TOO_LARGE: Answer((413,), (
        "a body over its limit: an API body (`VIDJOBS_MAX_BODY_BYTES`), an upload (`VIDJOBS_UPLOAD_MAX_BYTES`) "
        "or a provider callback (`VIDJOBS_WEBHOOK_MAX_BODY_BYTES`)")),
    GatewayCode.UNSUPPORTED_MEDIA_TYPE: Answer((415,), (
        "a JSON body not sent as `application/json`, or an upload that is not a PNG, JPEG or WebP image "
        "(its content is sniffed; the header is not trusted)")),
    GatewayCode.LIMIT_REACHED: Answer((429,), (
        "a cap on what one account may hold: jobs waiting for a slot (with `Retry-After`), open event streams, "
        "uploads a day, webhook endpoints, manual retries of a delivery, exports under way; `GET /v1/account` "
        "shows each")),
    ErrorCode.RATE_LIMITED: Answer((429,), (
        "too many requests for the API key, or provider callbacks for the provider; `Retry-After` says when "
        "to try again")),
    ErrorCode.INTERNAL: Answer((500,), "a fault of ours: it is logged under the answer's `request_id`"),
    GatewayCode.NOT_READY: Answer((503,), "`/readyz`: a dependency (the database, NATS, storage) is unreachable"),
    GatewayCode.UNAVAILABLE: Answer((503,), (
        "a part the request needs did not answer in time, or failed; retry after `Retry-After` (a create "
        "with the same `Idempotency-Key` is made once)")),
}


def _row(code: Code) -> str:
    answer = ANSWERS.get(code)
    statuses = ", ".join(str(s) for s in answer.statuses) if answer else "—"
    when = answer.when if answer else "never: only a job's failure"
    if isinstance(code, ErrorCode):
        retry = "retryable" if RETRYABLE[code] else "not retryable"
        in_job = f"{retry}: {DEFAULT_MESSAGES[code]}"
    else:
        in_job = "—"
    return f"| `{code.value}` | {statuses} | {when} | {in_job} |"


def error_table() -> str:
    """The markdown table of every code: a job's failure codes first, then the codes only answers carry."""
    lines = [
        "| code | HTTP status | when an API answer carries it | in a job's `error` (and its default message) |",
        "|---|---|---|---|",
    ]
    lines += [_row(code) for code in ErrorCode]
    lines += [_row(code) for code in GatewayCode]
    return "\n".join(lines) + "\n"
