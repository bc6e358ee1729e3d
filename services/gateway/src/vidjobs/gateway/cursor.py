"""Opaque keyset cursors: the position of the last row on the previous page, for job and webhook delivery
listings ((created_at, id)) and the credit ledger (the entry id). A cursor made for one listing does not decode
as the other's."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import TypeVar

import msgspec

from vidjobs.gateway.apierrors import ApiError, invalid


class JobPosition(msgspec.Struct, array_like=True):
    created_at: datetime
    id: str


class LedgerPosition(msgspec.Struct, array_like=True):
    id: int


Position = TypeVar("Position", JobPosition, LedgerPosition)


def encode(position: JobPosition | LedgerPosition) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(position)).rstrip(b"=").decode()


def decode(cursor: str, kind: type[Position]) -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        position = msgspec.json.decode(raw, type=kind)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise _foreign() from exc
    if isinstance(position, JobPosition) and position.created_at.tzinfo is None:
        raise _foreign()
    return position


def _foreign() -> ApiError:
    return invalid("cursor: not a cursor this API issued; pass next_cursor back unchanged", status=400)
