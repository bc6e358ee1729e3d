"""What can go wrong, as a small named taxonomy.

`APIError` is an answer the API gave: it carries the HTTP status, the API's error `code`, its message, whether
the same request may succeed later, and the request id to quote when asking about it. Its subclasses name the
statuses a caller handles differently. The rest are failures on the way to or after an answer.
"""

from __future__ import annotations


class VidjobsError(Exception):
    """Everything this client raises."""


class APIError(VidjobsError):
    """The API answered with an error."""

    def __init__(self, status: int, code: str, message: str, *, retryable: bool = False,
                 request_id: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(f"{message} ({code}, HTTP {status}" + (f", request {request_id})" if request_id else ")"))
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.request_id = request_id
        self.retry_after_s = retry_after_s


class InvalidRequest(APIError):
    """400 or 422: the request itself is wrong; the message names the field."""


class AuthenticationError(APIError):
    """401: no API key, or one the API does not know."""


class InsufficientCredits(APIError):
    """402: the account's credit does not cover the job."""


class NotFound(APIError):
    """404: no such thing in this account."""


class Conflict(APIError):
    """409: for example an idempotency key reused with another body."""


class RateLimited(APIError):
    """429: too many requests or jobs at once; `retry_after_s` says when to try again."""


class Unavailable(APIError):
    """503 (or another 5xx): the service cannot take the request now."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequest, 401: AuthenticationError, 402: InsufficientCredits, 404: NotFound,
    409: Conflict, 413: InvalidRequest, 415: InvalidRequest, 422: InvalidRequest, 429: RateLimited,
}


def error_class(status: int) -> type[APIError]:
    if status >= 500:
        return Unavailable
    return _BY_STATUS.get(status, APIError)


class ConnectionFailed(VidjobsError):
    """The API could not be reached (or stopped answering) after every retry."""


class WaitTimeout(VidjobsError):
    """`wait()` gave up before the job finished; the job itself goes on."""


class UploadRejected(VidjobsError):
    """The server decoded the uploaded image and refused it: `code` says why (image_corrupt, image_too_large,
    ...). Uploading the same bytes again would be refused again."""

    def __init__(self, upload_id: str, code: str, message: str) -> None:
        super().__init__(f"upload {upload_id} was rejected: {message} ({code})")
        self.upload_id = upload_id
        self.code = code
        self.message = message


class JobNotReady(VidjobsError):
    """The job has no video to download: it has not completed, or it failed, was canceled or expired."""

    def __init__(self, job_id: str, status: str) -> None:
        super().__init__(f"job {job_id} is {status}: it has no video to download")
        self.job_id = job_id
        self.status = status


class ChecksumMismatch(VidjobsError):
    """The downloaded file is not the one the job describes; it was not kept."""


class ConfigurationError(VidjobsError):
    """The client was not told enough to talk to the API (no key, or a URL it cannot use)."""
