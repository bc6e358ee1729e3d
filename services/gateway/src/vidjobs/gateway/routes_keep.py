"""`POST /v1/jobs/{job_id}/keep` keeps a ready job's clip past retention, within the account's storage quota;
`DELETE /v1/jobs/{job_id}/keep` releases it, and retention counts from its completion again. Both answer the
job as it now stands, and both may be repeated."""

from __future__ import annotations

from aiohttp import web

from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode
from vidjobs.gateway.bodies import JobOut
from vidjobs.gateway.keeping import NotKeepable, OverQuota
from vidjobs.gateway.owned import found, job_id_of, view
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def over_quota(err: OverQuota) -> ApiError:
    use = err.use
    return ApiError(409, GatewayCode.STORAGE_QUOTA_EXCEEDED,
                    f"keeping this clip ({_mb(err.adding)}) would pass the account's storage quota: kept clips hold "
                    f"{_mb(use.used_bytes)} of {_mb(use.limit_bytes)}; release one (DELETE /v1/jobs/{{id}}/keep) or "
                    "export it to your own bucket (POST /v1/jobs/{id}/export) first")


async def keep_job(request: web.Request) -> web.Response:
    try:
        kept = found(await tenant(request).keep(job_id_of(request)))
    except NotKeepable as err:
        raise ApiError(409, GatewayCode.CONFLICT, f"only a ready job's clip can be kept, and this job is "
                       f"{err.status.value}") from err
    except OverQuota as err:
        raise over_quota(err) from err
    return json_response(view(gateway(request), kept))


async def release_job(request: web.Request) -> web.Response:
    return json_response(view(gateway(request), found(await tenant(request).release(job_id_of(request)))))


_KEEP = "/v1/jobs/{job_id}/keep"

ROUTES = [
    Route("POST", _KEEP, keep_job, "keep_job",
          "Keep a ready job's clip past retention, counted against the account's storage quota",
          responses={200: JobOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut}),
    Route("DELETE", _KEEP, release_job, "release_job",
          "Stop keeping the job's clip: retention counts from its completion again (warned before it goes)",
          responses={200: JobOut, 401: ErrorOut, 404: ErrorOut}),
]
