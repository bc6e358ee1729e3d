"""`POST /v1/uploads`: an image for image-to-video, checked, stripped of metadata and stored for the account
(recorded through the caller's Tenant, under the caller's account).

The body is the raw image. It is read here in bounded chunks rather than through the app's JSON body limit,
so a body larger than `upload_max_bytes` is refused as soon as that many bytes have arrived (or at once, when
its Content-Length says so), and no more than the limit is ever held.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from aiohttp import web

from libs.common import ids
from libs.common.settings import Settings
from libs.common.uploads import UploadRow
from libs.storage.base import upload_prefix
from services.gateway import images
from services.gateway.bodies import UploadOut
from services.gateway.errors import ApiError, ErrorOut, GatewayCode
from services.gateway.routing import Route, json_response
from services.gateway.state import gateway
from services.gateway.tenant import tenant

log = logging.getLogger("vidjobs.gateway")

CHUNK_BYTES = 64 * 1024
CLEANER = web.AppKey("image_cleaner", images.Cleaner)


def install(app: web.Application, settings: Settings) -> None:
    """The image checks this app's uploads share (their decode slots are per process)."""
    app[CLEANER] = images.Cleaner(images.Limits(max_side=settings.upload_max_side,
                                                max_pixels=settings.upload_max_pixels))


def too_large(max_bytes: int) -> ApiError:
    return ApiError(413, GatewayCode.PAYLOAD_TOO_LARGE, f"the image is larger than {max_bytes} bytes, the limit")


async def read_capped(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, or 413 once it proves longer than `max_bytes` (by its header or by what arrived)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large(max_bytes)
    body = bytearray()
    while chunk := await request.content.read(min(CHUNK_BYTES, max_bytes + 1 - len(body))):
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    return bytes(body)


async def create_upload(request: web.Request) -> web.Response:
    gw, owner = gateway(request), tenant(request)
    raw = await read_capped(request, gw.settings.upload_max_bytes)
    image = await request.app[CLEANER](raw)
    upload_id = ids.new("upl")
    key = f"{upload_prefix(owner.account_id, upload_id)}image.{image.kind.extension}"
    # Stored first, recorded second: a crash in between leaves an object without a row, which the orphan
    # sweep removes; the other order could leave a row naming nothing.
    stored = await gw.storage.put_bytes(key, image.data, image.kind.content_type)
    row = UploadRow(id=upload_id, account_id=owner.account_id, key=key, content_type=image.kind.content_type,
                    bytes=stored.bytes, sha256=image.sha256, width=image.width, height=image.height,
                    created_at=datetime.now(UTC))
    await owner.add_upload(row)
    log.info("image uploaded", extra={"upload_id": upload_id, "account_id": owner.account_id, "bytes": row.bytes,
                                      "received_bytes": len(raw), "width": row.width, "height": row.height})
    return json_response(UploadOut(id=upload_id, width=row.width, height=row.height,
                                   content_type=row.content_type, bytes=row.bytes), status=201)


ROUTES = [
    Route("POST", "/v1/uploads", create_upload, "create_upload",
          "Upload a PNG, JPEG or WebP image for image-to-video; name its id as a job's input_image",
          body="image/*",
          responses={201: UploadOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}),
]
