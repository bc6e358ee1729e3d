"""The error taxonomy: a small, named set of failure kinds shared by every service.

`ErrorCode` is what a job's `error.code` says to a person; `VidjobsError` and its children are what code
raises. Each code carries whether retrying can help and a default message that says what to do next.
"""

from __future__ import annotations

import enum

import msgspec


class ErrorCode(enum.StrEnum):
    RATE_LIMITED = "rate_limited"  # the provider asked us to slow down
    PROVIDER_UNAVAILABLE = "provider_unavailable"  # the provider is down or answered 5xx
    TIMEOUT = "timeout"  # a stage passed its deadline
    # The render passed its deadline (its model's measured p99 and a margin): stopped at the provider, not
    # charged, and tried again only where the provider's retry policy says so; the owner may render it again.
    RENDER_TIMEOUT = "render_timeout"
    CONTENT_REJECTED = "content_rejected"  # the provider's content policy refused the prompt or image
    INVALID_INPUT = "invalid_input"  # the request can never succeed as written
    QUOTA_EXHAUSTED = "quota_exhausted"  # no credit left: the account's, or ours with the provider
    # The provider refused our account's credentials or our call itself (a key refused, an address that is
    # not its API): our configuration is wrong, not the job, and no attempt passes until an operator fixes it.
    PROVIDER_MISCONFIGURED = "provider_misconfigured"
    DOWNLOAD_FAILED = "download_failed"  # the render could not be copied into our storage
    VERIFICATION_FAILED = "verification_failed"  # the copied file is not a playable video
    CANCELED = "canceled"  # the owner canceled the job
    INTERNAL = "internal"  # our fault; retried where safe, reported otherwise


RETRYABLE: dict[ErrorCode, bool] = {
    ErrorCode.RATE_LIMITED: True,
    ErrorCode.PROVIDER_UNAVAILABLE: True,
    ErrorCode.TIMEOUT: True,
    ErrorCode.RENDER_TIMEOUT: True,  # the same request may well render in time later (not retried by itself)
    ErrorCode.CONTENT_REJECTED: False,
    ErrorCode.INVALID_INPUT: False,
    ErrorCode.QUOTA_EXHAUSTED: False,
    ErrorCode.PROVIDER_MISCONFIGURED: False,  # not until an operator fixes it: then render it again
    ErrorCode.DOWNLOAD_FAILED: True,
    ErrorCode.VERIFICATION_FAILED: False,
    ErrorCode.CANCELED: False,
    ErrorCode.INTERNAL: True,
}

DEFAULT_MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.RATE_LIMITED: "The provider is rate limiting us; the job will be retried automatically.",
    ErrorCode.PROVIDER_UNAVAILABLE: "The video provider is unavailable; the job will be retried.",
    ErrorCode.TIMEOUT: "The job took longer than its deadline allows.",
    ErrorCode.RENDER_TIMEOUT: "The provider did not finish the render within its deadline; it was stopped and "
                              "its credit released. Render it again to try once more.",
    ErrorCode.CONTENT_REJECTED: "The provider refused this prompt under its content policy; change it.",
    ErrorCode.INVALID_INPUT: "The request cannot be rendered as written; fix the named field.",
    ErrorCode.QUOTA_EXHAUSTED: "The account has no credit left for this job; add credit and retry.",
    ErrorCode.PROVIDER_MISCONFIGURED: "The video provider refused our credentials or our call; our operators "
                                      "are alerted. Render it again once it is fixed.",
    ErrorCode.DOWNLOAD_FAILED: "The finished render could not be copied into storage.",
    ErrorCode.VERIFICATION_FAILED: "The provider returned a file that is not a playable video.",
    ErrorCode.CANCELED: "The job was canceled by its owner.",
    ErrorCode.INTERNAL: "Something went wrong on our side; the job was stopped. Contact support.",
}


class JobError(msgspec.Struct, frozen=True):
    """The `error` object of a job, as stored and as shown."""

    code: ErrorCode  # what kind of failure: one of a small, fixed set
    message: str  # what happened and what to do, in words
    retryable: bool  # whether the same request may succeed later

    @classmethod
    def of(cls, code: ErrorCode, message: str | None = None) -> JobError:
        return cls(code=code, message=message or DEFAULT_MESSAGES[code], retryable=RETRYABLE[code])


class VidjobsError(Exception):
    """Root of every error vidjobs raises on purpose."""


class ConfigError(VidjobsError):
    """A setting is missing or malformed; the message names the variable."""


class PartUnavailable(Exception):
    """A part we run on (the object store, say) could not be reached or answered with a server error: the same
    call may succeed later. The libraries that talk to such a part raise subclasses of it, so `faults` can tell
    an infrastructure fault from the job's own without importing them."""


class StoreError(VidjobsError):
    """A database operation failed in a way the caller may handle."""


class QuotaExhausted(VidjobsError):
    """The account has too little free credit for what was asked."""


class QueueFull(VidjobsError):
    """The account already has as many jobs waiting for a slot as it may."""

    def __init__(self, limit: int):
        super().__init__(f"this account already has {limit} jobs waiting for a slot, its limit; wait for some "
                         "to start or cancel ones you no longer need")
        self.limit = limit


class ProviderError(VidjobsError):
    """A provider call failed; `code` classifies it, `retry_after` honours the provider's pacing.

    `unclear` marks a call that may have done its work although no answer came back (a timeout or a
    connection dropped after the request went out): for a submit, the render may exist."""

    def __init__(self, code: ErrorCode, message: str, *, retry_after: float | None = None, unclear: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.unclear = unclear

    @property
    def retryable(self) -> bool:
        return RETRYABLE[self.code]

    def to_job_error(self) -> JobError:
        return JobError.of(self.code, self.message)


class MediaError(VidjobsError):
    """Copying or verifying a render failed; `code` is download_failed or verification_failed.

    `final` marks a failure that no retry can mend (a render URL refused as unsafe), even for a code that is
    otherwise retried.
    """

    def __init__(self, code: ErrorCode, message: str, *, final: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.final = final

    def to_job_error(self) -> JobError:
        return JobError.of(self.code, self.message)


class WebhookRejected(VidjobsError):
    """A webhook failed verification: bad signature, unknown key, or a timestamp out of tolerance."""


class Redeliver(VidjobsError):
    """Raised by a message handler to have the work handed back after `delay` seconds.

    A deferral (the default) is not a failure and spends nothing: a job waiting for a slot may be deferred
    for hours. `counts=True` says this handling failed and spends one of the message's tries, so a failure
    that keeps recurring ends in the dead letters rather than looping."""

    def __init__(self, reason: str, delay: float = 1.0, *, counts: bool = False):
        super().__init__(reason)
        self.delay = delay
        self.counts = counts


class GiveUp(VidjobsError):
    """Raised by a message handler whose work can never succeed and must not be tried again: the message is
    dead-lettered at once and its job failed with `internal`."""
