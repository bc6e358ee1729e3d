"""`POST /v1/jobs/{job_id}/export`: copy a ready job's stored original to a presigned PUT URL of the account's
own bucket; `GET /v1/jobs/{job_id}/exports[/{export_id}]`: how it went.

The URL passes the request-forgery guard when it is named (its form, its literal address and the addresses
its name resolves to), so a refusal is told at once with its reason; the media service, which makes the PUT,
checks it again as it connects. The copy itself is the media service's (vidjobs.media.exporting)."""

from __future__ import annotations

import re

from aiohttp import web

from vidjobs.common import netguard
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, invalid, not_found
from vidjobs.gateway.bodies import ExportIn, ExportList, ExportOut
from vidjobs.gateway.decoding import read_json
from vidjobs.gateway.exports import ExportRow, NotExportable, TooManyExports
from vidjobs.gateway.owned import job_id_of
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant

EXPORT_ID = re.compile(r"^exp_[0-9a-z]{1,64}$")
LISTED = 20
BUSY_RETRY_AFTER_S = 10  # about when a pending export may have ended


def export_out(row: ExportRow) -> ExportOut:
    return ExportOut(id=row.id, job_id=row.job_id, host=row.host, status=row.status, reason=row.reason,
                     attempts=row.attempts, bytes=row.bytes, created_at=row.created_at, finished_at=row.finished_at)


async def checked_destination(url: str, hosts: frozenset[str]) -> str:
    """The URL's host as shown with the export, once the guard lets it through; a 422 with its reason if not."""
    try:
        parsed = await netguard.check_destination(url, netguard.DownloadGuard(hosts, netguard.EXPORTS))
    except netguard.UnsafeDestination as err:
        raise invalid(f"url: {err}") from err
    return f"{parsed.raw_host}:{parsed.port}" if parsed.port and not parsed.is_default_port() else str(parsed.raw_host)


async def start_export(request: web.Request) -> web.Response:
    gw, owner = gateway(request), tenant(request)
    job_id = job_id_of(request)
    # Another account's job answers as a missing one does, whatever the body.
    if await owner.job(job_id) is None:
        raise not_found()
    body = await read_json(request, ExportIn, gw.settings.max_body_bytes)
    host = await checked_destination(body.url, gw.settings.allowed_export_hosts())
    try:
        made = await owner.start_export(job_id, body.url, host)
    except NotExportable as err:
        raise ApiError(409, GatewayCode.CONFLICT, f"only a ready job's clip can be exported, and this job is "
                       f"{err.status.value}") from err
    except TooManyExports as err:
        raise ApiError(429, GatewayCode.LIMIT_REACHED, f"the account has {err.limit} exports under way, the most "
                       "it may; ask again once one is done", retryable=True,
                       headers={"Retry-After": str(BUSY_RETRY_AFTER_S)}) from err
    if made is None:
        raise not_found()
    return json_response(export_out(made), status=202,
                         headers={"Location": f"/v1/jobs/{job_id}/exports/{made.id}"})


async def get_export(request: web.Request) -> web.Response:
    export_id = request.match_info["export_id"]
    if not EXPORT_ID.match(export_id):
        raise not_found("export")
    found = await tenant(request).export(job_id_of(request), export_id)
    if found is None:
        raise not_found("export")
    return json_response(export_out(found))


async def list_exports(request: web.Request) -> web.Response:
    owner = tenant(request)
    job_id = job_id_of(request)
    if await owner.job(job_id) is None:
        raise not_found()
    return json_response(ExportList(data=[export_out(r) for r in await owner.exports(job_id, LISTED)]))


_JOB = "/v1/jobs/{job_id}"

ROUTES = [
    Route("POST", f"{_JOB}/export", start_export, "export_job",
          "Copy a ready job's stored original to a presigned PUT URL of your own bucket", body=ExportIn,
          response_headers={202: {"Location": {"description": "the export's status",
                                               "schema": {"type": "string"}}}},
          responses={202: ExportOut, 400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut,
                     415: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
    Route("GET", f"{_JOB}/exports", list_exports, "list_exports", "The job's exports, newest first",
          responses={200: ExportList, 401: ErrorOut, 404: ErrorOut}),
    Route("GET", f"{_JOB}/exports/{{export_id}}", get_export, "get_export", "One export: pending, done or failed",
          responses={200: ExportOut, 401: ErrorOut, 404: ErrorOut}),
]
