"""`POST /v1/uploads` and `GET /v1/uploads/{id}`: an image for image-to-video, taken in here and decoded by
the media worker, never in this process (recorded through the caller's Tenant, under the caller's account).

The body is the raw image. It is read in bounded chunks rather than through the app's JSON body limit, so a
body larger than `upload_max_bytes` is refused as soon as that many bytes have arrived (or at once, when its
Content-Length says so), and no more than the limit is ever held. Only the header is read here (its format
and the size it declares, imageheaders): what fails that is refused at once. What passes is stored in
quarantine and recorded as `processing`; the media worker decodes and cleans it and marks it `ready` or
`rejected`. The answer is 201 with the upload as it stands (the upload exists at once; its `status` says
whether a job may name it yet). No image decoder is imported by the gateway.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import re
from datetime import UTC, datetime, time, timedelta
from typing import cast

from aiohttp import web

from vidjobs.common import ids
from vidjobs.common.errors import ErrorCode
from vidjobs.common.imageheaders import Header, ImageRefused, Limits, Refusal, read_header
from vidjobs.common.uploads import REASON_UNPROCESSED, UploadRow, UploadStatus
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, account_disabled, not_found
from vidjobs.gateway.bodies import ImageType, UploadErrorOut, UploadOut, UploadRefusal
from vidjobs.gateway.decoding import read_body
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant
from vidjobs.storage import integrity
from vidjobs.storage.base import quarantine_key, upload_prefix

log = logging.getLogger("vidjobs.gateway")

UPLOAD_ID = re.compile(r"^upl_[0-9a-z]{1,64}$")
# Hashing a body of several MiB takes milliseconds: off the event loop past this size.
HASH_INLINE_BYTES = 256 * 1024


def uploads_capped(cap: int) -> ApiError:
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), time(), UTC)
    wait = max(1, math.ceil((midnight - now).total_seconds()))
    return ApiError(429, GatewayCode.LIMIT_REACHED,
                    f"this account has made its {cap} image uploads for today; the count resets at 00:00 UTC, "
                    "or reuse an upload id you already have", retryable=True, headers={"Retry-After": str(wait)})


def checked_header(raw: bytes, limits: Limits) -> Header:
    """The header, or the refusal the API answers for it: 415 for a format we do not take, 422 otherwise."""
    try:
        return read_header(raw, limits)
    except ImageRefused as refused:
        if refused.reason is Refusal.UNSUPPORTED:
            raise ApiError(415, GatewayCode.UNSUPPORTED_MEDIA_TYPE, refused.message) from refused
        raise ApiError(422, ErrorCode.INVALID_INPUT, refused.message) from refused


async def _sha256(data: bytes) -> str:
    if len(data) <= HASH_INLINE_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())


def upload_view(row: UploadRow) -> UploadOut:
    # The row's text columns hold only these values (the table's checks, imageheaders.Refusal): the casts
    # tell the type checker what the database already guarantees.
    error = None
    if row.status is UploadStatus.REJECTED:
        error = UploadErrorOut(code=cast(UploadRefusal, row.reason or REASON_UNPROCESSED),
                               message=row.message or "the image was rejected")
    return UploadOut(id=row.id, status=row.status.value, width=row.width, height=row.height,
                     content_type=cast(ImageType, row.content_type), bytes=row.bytes, error=error)


async def create_upload(request: web.Request) -> web.Response:
    gw, owner = gateway(request), tenant(request)
    if await owner.disabled():
        raise account_disabled()
    cap = gw.settings.max_uploads_per_day
    if await owner.uploads_today() >= cap:  # before the body is read: a refused upload costs nothing
        raise uploads_capped(cap)
    raw = await read_body(request, gw.settings.upload_max_bytes, "image")
    header = checked_header(raw, gw.settings.upload_limits())
    upload_id = ids.new("upl")
    # Stored first, recorded second: a crash in between leaves an object without a row, which the orphan
    # sweep removes; the other order could leave a row naming nothing.
    # Read back and compared (size and SHA-256) before it is recorded; a store that keeps mangling it is
    # unavailable (503), like one that does not answer.
    sha256 = await _sha256(raw)
    await integrity.put_verified(gw.storage, quarantine_key(owner.account_id, upload_id), raw,
                                 header.kind.content_type, sha256=sha256, attempts=gw.settings.store_verify_attempts)
    row = UploadRow(id=upload_id, account_id=owner.account_id,
                    key=f"{upload_prefix(owner.account_id, upload_id)}image.{header.kind.extension}",
                    content_type=header.kind.content_type, bytes=len(raw), sha256=sha256,
                    width=header.width, height=header.height, created_at=datetime.now(UTC),
                    status=UploadStatus.PROCESSING)
    if not await owner.add_upload(row, daily_cap=cap):
        await gw.storage.delete_prefix(upload_prefix(owner.account_id, upload_id))  # lost the race for the cap
        raise uploads_capped(cap)
    log.info("image received; waiting for the media worker",
             extra={"upload_id": upload_id, "account_id": owner.account_id, "received_bytes": len(raw),
                    "width": row.width, "height": row.height})
    return json_response(upload_view(row), status=201, headers={"Location": f"/v1/uploads/{upload_id}"})


async def get_upload(request: web.Request) -> web.Response:
    upload_id = request.match_info["upload_id"]
    row = await tenant(request).upload(upload_id) if UPLOAD_ID.match(upload_id) else None
    if row is None:
        raise not_found("upload")
    return json_response(upload_view(row))


ROUTES = [
    Route("POST", "/v1/uploads", create_upload, "create_upload",
          "Upload a PNG, JPEG or WebP image for image-to-video; it is `processing` until the media worker has "
          "decoded it, then `ready` (name its id as a job's input_image) or `rejected`",
          body="image/*",
          response_headers={201: {"Location": {"description": "the upload, to read its status",
                                               "schema": {"type": "string"}}}},
          token_scope="upload",
          responses={201: UploadOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
    Route("GET", "/v1/uploads/{upload_id}", get_upload, "get_upload",
          "One upload: whether it is processing, ready or rejected (and why)",
          token_scope="upload",
          responses={200: UploadOut, 401: ErrorOut, 404: ErrorOut}),
]
