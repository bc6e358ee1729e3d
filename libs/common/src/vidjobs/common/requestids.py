"""Request ids: the id of the HTTP request whose effects are being worked on, carried from the gateway through
the outbox and every JetStream message that request caused, so one id finds every log line of its work in
every service.

The gateway takes a client's `X-Request-Id` when it is well-formed and makes one otherwise. A message's id
travels in its `Vidjobs-Request-Id` header, and a consumer handles the message under it, so the messages its
handling causes carry it on. Work that no client asked for (a provider's callback, a recovery check) goes on
under the request id of the job it is about, kept on the job's row since its creation.
"""

from __future__ import annotations

import re
import secrets
from contextvars import ContextVar, Token

HEADER = "X-Request-Id"
MESSAGE_HEADER = "Vidjobs-Request-Id"
_WELL_FORMED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")

_current: ContextVar[str | None] = ContextVar("vidjobs_request_id", default=None)


def new() -> str:
    return "req_" + secrets.token_hex(12)


def accept(sent: str | None) -> str:
    """A client's id if it is well-formed (1-128 letters, digits, `.`, `_`, `:` or `-`), else a new one."""
    return sent if sent is not None and _WELL_FORMED.match(sent) else new()


def well_formed(value: str | None) -> bool:
    return value is not None and _WELL_FORMED.match(value) is not None


def current() -> str | None:
    return _current.get()


def use(request_id: str | None) -> Token[str | None]:
    """Work from here on (in this task and the tasks it starts) is `request_id`'s; reset with the token."""
    return _current.set(request_id)


def reset(token: Token[str | None]) -> None:
    _current.reset(token)


def continue_job(job_request_id: str | None) -> None:
    """The work at hand is about a job: go on under the request that created it. Called where a message that
    no client request caused (a provider callback, a recovery check) has found its job."""
    if job_request_id is not None:
        _current.set(job_request_id)
