"""Structured logging: one JSON object per line, carrying whatever context (job id, provider) was passed
in `extra`, the id of the request being worked on (requestids), and the job and account being worked on
(`about_job`, `about_account`), so that every line of one account's or one job's work can be found."""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime

from vidjobs.common import requestids

# Set for the rest of the current task (a message's handling, a request) once it knows what it works on.
_subject: ContextVar[dict[str, str] | None] = ContextVar("vidjobs_log_subject", default=None)


def about_job(job_id: str, account_id: str) -> None:
    """The work at hand is this job's, of this account: every later line of this task says so."""
    _subject.set({"job_id": job_id, "account_id": account_id})


def about_account(account_id: str, **who: str) -> None:
    """The work at hand is this account's (an authenticated request); `who` names the credential when it is
    not the account's own key (`platform_key_id` acting for it, `browser_token_id`)."""
    _subject.set({"account_id": account_id, **who})


def about_platform(platform_key_id: str) -> None:
    """The work at hand is a platform's (a request made with a platform key on a platform route)."""
    _subject.set({"platform_key_id": platform_key_id})


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
    """`service level message name=value ...`, one line per record; a traceback follows on lines of its own,
    each marked `  | `. What clients and providers send reaches these lines (paths, headers, body fields), so
    every piece is escaped: no value can end the line and write one that looks like ours. Within the line a
    value (or a message) that holds a space, `=` or `"` is written in double quotes, as logfmt readers take
    it, so it cannot pass for pairs of its own either."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields = [(k, v) for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")]
        if (request_id := requestids.current()) is not None and "request_id" not in record.__dict__:
            fields.append(("request_id", request_id))
        fields += [(k, v) for k, v in subject().items() if k not in record.__dict__]
        extras = " ".join(f"{_name(k)}={_value(v)}" for k, v in fields)
        line = f"{self.service:9} {record.levelname.lower():7} {_message(record.getMessage())} {extras}".rstrip()
        if record.exc_info:
            line += "".join(f"\n  | {escape(part)}" for part in self.formatException(record.exc_info).split("\n"))
        return line


# What ends a line for some reader (C0 controls, DEL, C1 controls such as NEL, the line and paragraph
# separators) or makes a line show other than it reads (bidirectional marks, embeddings, overrides and
# isolates; zero-width characters; the byte order mark), and lone surrogates: header bytes that were not
# UTF-8, which a strict writer would refuse.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(value: object) -> str:
    """`value` as text with every unsafe character written as an escape (`\\n`, `\\x1b`, `\\u2028`)."""
    return _UNSAFE.sub(_escaped, str(value))


_SPLITS_A_PAIR = re.compile(r'[\s="]')


def _value(value: object) -> str:
    """Bare where it is plain; else in double quotes, with escapes (`\\\\`, `\\"`, `\\n`, `\\x1b`) that mean
    something only there, so a reader gets back exactly the value."""
    text = str(value)
    if text and not _SPLITS_A_PAIR.search(text) and not _UNSAFE.search(text):
        return text
    return '"' + escape(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _message(message: str) -> str:
    # Words as they are, for reading; quoted only where it could be taken for the pairs after it, or escaped.
    return _value(message) if _UNSAFE.search(message) or "=" in message or '"' in message else message


def _name(name: str) -> str:
    # Names come from code; one that does not is written so it still reads as one name.
    return _SPLITS_A_PAIR.sub(_escaped, escape(name))


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def setup(service: str, *, level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else TextFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries chatter at INFO about every connection; keep their warnings only.
    for noisy in ("aiohttp.access", "nats", "asyncio", "botocore", "aiobotocore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
