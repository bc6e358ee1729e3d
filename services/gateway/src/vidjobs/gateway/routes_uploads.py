"""`POST /v1/uploads`: an image for image-to-video, checked, stripped of metadata and stored for the account
(recorded through the caller's Tenant, under the caller's account).

The body is the raw image. It is read here in bounded chunks rather than through the app's JSON body limit,
so a body larger than `upload_max_bytes` is refused as soon as that many bytes have arrived (or at once, when
its Content-Length says so), and no more than the limit is ever held.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, time, timedelta

from aiohttp import web

from vidjobs.common import ids
from vidjobs.common.settings import Settings
from vidjobs.common.uploads import UploadRow
from vidjobs.gateway import images
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode
from vidjobs.gateway.bodies import UploadOut
from vidjobs.gateway.decoding import read_body
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant
from vidjobs.storage import integrity
from vidjobs.storage.base import upload_prefix

log = logging.getLogger("vidjobs.gateway")

CLEANER = web.AppKey("image_cleaner", images.Cleaner)


def install(app: web.Application, settings: Settings) -> None:
    """The image checks this app's uploads share (their decode slots are per process)."""
    app[CLEANER] = images.Cleaner(images.Limits(max_side=settings.upload_max_side,
                                                max_pixels=settings.upload_max_pixels))


def uploads_capped(cap: int) -> ApiError:
    now = datetime.now(UTC)
    midnight = datetime.combine(now.date() + timedelta(days=1), time(), UTC)
    wait = max(1, math.ceil((midnight - now).total_seconds()))
    return ApiError(429, GatewayCode.LIMIT_REACHED,
                    f"this account has made its {cap} image uploads for today; the count resets at 00:00 UTC, "
                    "or reuse an upload id you already have", retryable=True, headers={"Retry-After": str(wait)})


async def create_upload(request: web.Request) -> web.Response:
    gw, owner = gateway(request), tenant(request)
    cap = gw.settings.max_uploads_per_day
    if await owner.uploads_today() >= cap:  # before the body is read: a refused upload costs nothing
        raise uploads_capped(cap)
    raw = await read_body(request, gw.settings.upload_max_bytes, "image")
    image = await request.app[CLEANER](raw)
    upload_id = ids.new("upl")
    key = f"{upload_prefix(owner.account_id, upload_id)}image.{image.kind.extension}"
    # Stored first, recorded second: a crash in between leaves an object without a row, which the orphan
    # sweep removes; the other order could leave a row naming nothing.
    # Read back and compared (size and SHA-256) before it is recorded; a store that keeps mangling it is
    # unavailable (503), like one that does not answer.
    stored = await integrity.put_verified(gw.storage, key, image.data, image.kind.content_type, sha256=image.sha256,
                                          attempts=gw.settings.store_verify_attempts)
    row = UploadRow(id=upload_id, account_id=owner.account_id, key=key, content_type=image.kind.content_type,
                    bytes=stored.bytes, sha256=image.sha256, width=image.width, height=image.height,
                    created_at=datetime.now(UTC))
    if not await owner.add_upload(row, daily_cap=cap):
        await gw.storage.delete_prefix(upload_prefix(owner.account_id, upload_id))  # lost the race for the cap
        raise uploads_capped(cap)
    log.info("image uploaded", extra={"upload_id": upload_id, "account_id": owner.account_id, "bytes": row.bytes,
                                      "received_bytes": len(raw), "width": row.width, "height": row.height})
    return json_response(UploadOut(id=upload_id, width=row.width, height=row.height,
                                   content_type=image.kind.content_type, bytes=row.bytes), status=201)


ROUTES = [
    Route("POST", "/v1/uploads", create_upload, "create_upload",
          "Upload a PNG, JPEG or WebP image for image-to-video; name its id as a job's input_image",
          body="image/*",
          responses={201: UploadOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}),
]
