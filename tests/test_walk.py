"""bench/walk.py, the job walk, on one job through the real stack: it finds the files the gateway enters for
the job's requests, and each worker's handler of the job's message."""

from __future__ import annotations

from bench.walk import SERVICES, report, walk
from tests.workspace import member


async def test_the_walk_follows_one_job_through_every_process(database_url, nats_url):
    result = await walk(database_url=database_url, nats_url=nats_url, settle_s=1.0, grace_s=0.5)

    gateway = result.files("gateway", "handler")
    # The request's path runs through the gateway's own code and common's, each file named as it is on disk.
    assert {path.split("/")[0] for path in gateway} >= {"gateway", "common"}, gateway
    for path in gateway:
        service, _, rest = path.partition("/")
        if service == "gateway":
            assert (member("vidjobs.gateway").source / rest).is_file(), path
    # The job's messages: submitted, its callback's signal handled, its render stored.
    for service in ("submitter", "poller", "media"):
        assert any(path.startswith(f"{service}/") for path in result.files(service, "handler")), service
    text = report(result)
    for service in SERVICES:
        assert f"\n== {service}: " in text
    assert "\ntotal: " in text and "distinct first-party files over 5 processes" in text
