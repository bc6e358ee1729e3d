"""Structured logging: one JSON object per line, carrying whatever context (job id, provider) was passed
in `extra`, and the id of the request being worked on (requestids)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from libs.common import requestids

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
