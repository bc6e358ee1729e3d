"""Opaque keyset cursors for job listings: the (created_at, id) of the last job on the previous page."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

import msgspec

from services.gateway.errors import invalid


class _Position(msgspec.Struct, array_like=True):
    created_at: datetime
    id: str


def encode(created_at: datetime, job_id: str) -> str:
    raw = msgspec.json.encode(_Position(created_at, job_id))
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = msgspec.json.decode(raw, type=_Position)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise invalid("cursor: not a cursor this API issued; pass next_cursor back unchanged", status=400) from exc
    if position.created_at.tzinfo is None:
        raise invalid("cursor: not a cursor this API issued; pass next_cursor back unchanged", status=400)
    return position.created_at, position.id
