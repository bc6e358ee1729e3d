"""Structured logging: one JSON object per line, carrying whatever context (job id, provider) was passed
in `extra`, the id of the request being worked on (requestids), and the job and account being worked on
(`about_job`, `about_account`), so that every line of one account's or one job's work can be found."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

from vidjobs.common import requestids

# Set for the rest of the current task (a message's handling, a request) once it knows what it works on.
_subject: ContextVar[dict[str, str] | None] = ContextVar("vidjobs_log_subject", default=None)


def about_job(job_id: str, account_id: str) -> None:
    """The work at hand is this job's, of this account: every later line of this task says so."""
    _subject.set({"job_id": job_id, "account_id": account_id})


def about_account(account_id: str) -> None:
    """The work at hand is this account's (an authenticated request)."""
    _subject.set({"account_id": account_id})


def subject() -> dict[str, str]:
    return _subject.get() or {}


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if (request_id := requestids.current()) is not None:
            out["request_id"] = request_id
        out.update(subject())  # what the line passes itself wins, below
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")
        )
        if (request_id := requestids.current()) is not None and "request_id" not in record.__dict__:
            extras += f" request_id={request_id}"
        for key, value in subject().items():
            if key not in record.__dict__:
                extras += f" {key}={value}"
        line = f"{self.service:9} {record.levelname.lower():7} {record.getMessage()} {extras}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(service: str, *, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries chatter at INFO about every connection; keep their warnings only.
    for noisy in ("aiohttp.access", "nats", "asyncio", "botocore", "aiobotocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
