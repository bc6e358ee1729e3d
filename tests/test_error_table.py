"""The error table of docs/API.md is written from `vidjobs.gateway.errortable`: every code an answer or a job
can carry is in it, and every status the gateway's code answers a code with is one the table gives for it."""

from __future__ import annotations

import re
from pathlib import Path

from vidjobs.common.errors import ErrorCode
from vidjobs.gateway import apierrors
from vidjobs.gateway.apidoc import reference
from vidjobs.gateway.apierrors import GatewayCode
from vidjobs.gateway.errortable import ANSWERS, error_table

GATEWAY_SOURCE = Path(apierrors.__file__).parent

# `ApiError(429, ErrorCode.RATE_LIMITED, ...)`, `error_response(503, GatewayCode.UNAVAILABLE, ...)`
_RAISED = re.compile(r"(?:ApiError|error_response)\(\s*(\d{3}),\s*(ErrorCode|GatewayCode)\.(\w+)")


def answered() -> set[tuple[int, str]]:
    """Every (status, code) the gateway's code answers with, read from its source."""
    found = set()
    for path in GATEWAY_SOURCE.rglob("*.py"):
        for status, enum, name in _RAISED.findall(path.read_text()):
            found.add((int(status), (ErrorCode if enum == "ErrorCode" else GatewayCode)[name].value))
        # The helpers: `invalid(...)` answers 422, or 400 when told; `not_found(...)` 404.
        if re.search(r"\binvalid\(", path.read_text()):
            found |= {(422, ErrorCode.INVALID_INPUT.value)}
        if re.search(r"status=400", path.read_text()):
            found |= {(400, ErrorCode.INVALID_INPUT.value)}
        if re.search(r"\bnot_found\(", path.read_text()):
            found |= {(404, GatewayCode.NOT_FOUND.value)}
    # What aiohttp raises itself is mapped onto our codes.
    found |= {(status, code.value) for status, code in apierrors._HTTP_CODES.items()}
    return found


def test_every_status_the_code_answers_is_in_the_table():
    documented = {(status, code.value) for code, answer in ANSWERS.items() for status in answer.statuses}
    assert answered() - documented == set()


def test_every_code_is_in_the_table_and_on_the_page():
    assert set(GatewayCode) <= ANSWERS.keys()
    table = error_table()
    for code in (*ErrorCode, *GatewayCode):
        assert f"| `{code.value}` |" in table
    assert table in reference()


def test_the_scan_sees_the_answers_it_must():
    found = answered()
    assert {(401, "unauthorized"), (402, "quota_exhausted"), (422, "invalid_input"), (400, "invalid_input"),
            (404, "not_found"), (429, "rate_limited"), (503, "unavailable"), (500, "internal")} <= found
