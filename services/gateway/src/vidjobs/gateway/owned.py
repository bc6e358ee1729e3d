"""The caller's own job, named by the request's path, and the job as every read shows it: shared by the job
routes and the event stream."""

from __future__ import annotations

import re

from aiohttp import web

from vidjobs.gateway.apierrors import not_found
from vidjobs.gateway.bodies import JobOut
from vidjobs.gateway.state import Gateway
from vidjobs.gateway.tenant import OwnedJob, tenant
from vidjobs.gateway.views import cost, job_view

JOB_ID = re.compile(r"^job_[0-9a-z]{1,64}$")


def view(gw: Gateway, owned: OwnedJob) -> JobOut:
    return job_view(owned.job, owned.waiting_position, owned.outputs, gw.storage, gw.settings, owned.estimate,
                    cost(owned.job, owned.provider_credits, owned.absorbed), ready=owned.ready)


def job_id_of(request: web.Request) -> str:
    job_id = request.match_info["job_id"]
    if not JOB_ID.match(job_id):
        raise not_found()
    return job_id


def found(job: OwnedJob | None) -> OwnedJob:
    if job is None:
        raise not_found()
    return job


async def owned_or_404(request: web.Request) -> OwnedJob:
    return found(await tenant(request).job(job_id_of(request)))
