"""google.rpc on the wire, as Google's APIs (the Gemini API among them) report trouble: a `Status` in an error
answer's `error` and in a finished long-running operation's `error`, its code names and the `details` we read
(ErrorInfo's reason, RetryInfo's delay), and what each means in our taxonomy."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from vidjobs.common.errors import ErrorCode

# google.rpc.Code numbers, as an operation's `error.code` carries them: every code google.rpc defines, so the
# message names the one Google sent, whichever it is.
_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED",
    11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
_CODES: dict[str, ErrorCode] = {
    # The request as written cannot succeed (UNIMPLEMENTED: the model does not do what it asks); trying again
    # would pay for nothing.
    **dict.fromkeys(("INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNIMPLEMENTED"),
                    ErrorCode.INVALID_INPUT),
    # Our project's quota ran out mid-render: nothing wrong with the job, and it may pass later.
    "RESOURCE_EXHAUSTED": ErrorCode.PROVIDER_UNAVAILABLE, "DEADLINE_EXCEEDED": ErrorCode.TIMEOUT,
    # Our key or project refused: no call passes until an operator fixes it.
    **dict.fromkeys(("PERMISSION_DENIED", "UNAUTHENTICATED"), ErrorCode.PROVIDER_MISCONFIGURED),
}


class Status(msgspec.Struct, kw_only=True):
    """google.rpc.Status: an operation's `error`, and the `error` of an HTTP error answer (with `status`)."""

    code: int = 0
    message: str = ""
    status: str | None = None
    details: list[dict[str, Any]] = []

    @property
    def code_name(self) -> str:
        """The code's name (`INVALID_ARGUMENT`): as given, or looked up from its number (a number google.rpc
        does not define is UNKNOWN's meaning, under its own number)."""
        return self.status or _NAMES.get(self.code, f"UNKNOWN ({self.code})"[:40])

    @property
    def meaning(self) -> ErrorCode:
        """What a failed operation's status means in our taxonomy; anything unlisted is the provider's trouble."""
        return _CODES.get(self.code_name, ErrorCode.PROVIDER_UNAVAILABLE)

    def detail(self, kind: str) -> dict[str, Any]:
        """The first `details` entry of a type (`google.rpc.ErrorInfo`, `google.rpc.RetryInfo`), or {}."""
        for item in self.details:
            if isinstance(item, dict) and str(item.get("@type", "")).endswith(f"/google.rpc.{kind}"):
                return item
        return {}

    def retry_delay(self) -> float | None:
        """RetryInfo's `retryDelay` ("33s", a protobuf Duration in JSON) in seconds."""
        delay = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(self.detail("RetryInfo").get("retryDelay", "")))
        return float(delay.group(1)) if delay else None


class ErrorAnswer(msgspec.Struct):
    error: Status
