"""Every error the API answers, as one JSON shape: `{"error": {"code", "message", "retryable"}}`.

Job-level failures use the shared taxonomy (`ErrorCode`); failures that only exist at the HTTP edge
(authentication, a missing resource, a reused idempotency key) have a small taxonomy of their own here.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Literal

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.common import faults, requestids
from vidjobs.common.errors import ErrorCode

log = logging.getLogger("vidjobs.gateway")

UNAVAILABLE_RETRY_AFTER_S = 5  # a stall or restart of a dependency: about when trying again is worth it


class GatewayCode(enum.StrEnum):
    UNAUTHORIZED = "unauthorized"  # no API key, or one we do not know
    FORBIDDEN = "forbidden"  # a credential that may not do this (a scope it lacks), or a bad signed URL
    NOT_FOUND = "not_found"  # no such resource for this account
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"  # an idempotency key reused with a different body
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    NOT_READY = "not_ready"  # a dependency (database, NATS) is unreachable
    UNAVAILABLE = "unavailable"  # a part we run on did not answer in time, or failed; retry after Retry-After
    LIMIT_REACHED = "limit_reached"  # a cap on what one account may hold (streams, queued jobs, uploads)
    STORAGE_QUOTA_EXCEEDED = "storage_quota_exceeded"  # keeping this clip would pass the account's storage quota
    UPLOAD_NOT_READY = "upload_not_ready"  # a job names an upload the media worker has not decoded yet
    UPLOAD_REJECTED = "upload_rejected"  # a job names an upload whose image was rejected
    ACCOUNT_DISABLED = "account_disabled"  # its platform disabled the account: reads only


Code = ErrorCode | GatewayCode


# Every code an error body can carry, listed in the OpenAPI document as the field's enum. Built from the two
# enums, which a type checker cannot follow: to it, the field is a string.
if TYPE_CHECKING:
    CodeName = str
else:
    CodeName = Literal[tuple(c.value for c in (*ErrorCode, *GatewayCode))]


class ErrorBody(msgspec.Struct, frozen=True):
    code: CodeName  # what kind of error: one of a small, fixed set
    message: str  # what went wrong and what to do, naming the field at fault
    retryable: bool  # whether the same request may succeed later (after Retry-After, if given)
    request_id: str | None = None  # the X-Request-Id of the request, to quote when asking about it


class ErrorOut(msgspec.Struct, frozen=True):
    error: ErrorBody  # every error answer has this one shape


class ApiError(Exception):
    """Raised by a handler to answer with an error; the middleware renders it."""

    def __init__(self, status: int, code: Code, message: str, *, retryable: bool = False,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.headers = headers or {}


def invalid(message: str, *, status: int = 422) -> ApiError:
    return ApiError(status, ErrorCode.INVALID_INPUT, message)


def account_disabled() -> ApiError:
    return ApiError(403, GatewayCode.ACCOUNT_DISABLED, "this account is disabled by its platform: its jobs may be "
                    "read, and nothing new made, until it is enabled again")


def not_found(what: str = "job") -> ApiError:
    return ApiError(404, GatewayCode.NOT_FOUND, f"no such {what}")


def error_response(status: int, code: Code, message: str, *, retryable: bool = False,
                   headers: dict[str, str] | None = None) -> web.Response:
    body = ErrorOut(ErrorBody(code=code.value, message=message, retryable=retryable,
                              request_id=requestids.current()))
    return web.Response(status=status, body=msgspec.json.encode(body), content_type="application/json",
                        headers=headers)


# aiohttp raises these itself (routing, body limits); they get our shape too.
_HTTP_CODES: dict[int, Code] = {
    400: ErrorCode.INVALID_INPUT,
    401: GatewayCode.UNAUTHORIZED,
    403: GatewayCode.FORBIDDEN,
    404: GatewayCode.NOT_FOUND,
    405: GatewayCode.METHOD_NOT_ALLOWED,
    413: GatewayCode.PAYLOAD_TOO_LARGE,
    415: GatewayCode.UNSUPPORTED_MEDIA_TYPE,
}


def _from_http(exc: web.HTTPException) -> web.Response:
    code = _HTTP_CODES.get(exc.status, ErrorCode.INTERNAL if exc.status >= 500 else ErrorCode.INVALID_INPUT)
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    message = "request body is too large" if exc.status == 413 else exc.reason.lower()
    return error_response(exc.status, code, message, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return error_response(err.status, err.code, err.message, retryable=err.retryable, headers=err.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http(exc)
    except Exception as exc:
        if faults.is_infrastructure(exc):
            return _unavailable(request, exc)
        # Never a row or a stack trace to the client: the details go to the log.
        log.exception("unhandled error", extra={"path": request.path, "method": request.method})
        return error_response(500, ErrorCode.INTERNAL, "internal error; it has been logged", retryable=True)


def _unavailable(request: web.Request, exc: Exception) -> web.Response:
    """A part we run on (the database, NATS, storage) stopped answering or failed, which says nothing about
    the request: the same request succeeds once it is back. A create that meets this may or may not have
    been made; sent again with its Idempotency-Key it is made once."""
    log.warning("a dependency did not answer; request refused with 503", extra={
        "path": request.path, "method": request.method, "error": repr(exc)})
    return error_response(503, GatewayCode.UNAVAILABLE, "a service this request needs is not answering; "
                          "retry after Retry-After (with the same Idempotency-Key, for a create)", retryable=True,
                          headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})
