"""Request ids through the real stack: every response carries `X-Request-Id` (a well-formed one the client
sent is kept), error bodies name it, the gateway writes one access line per request, and the id of the
request that created a job is in the log lines of every service that worked on that job, as is the job's
account on every line about the job."""

from __future__ import annotations

import json
import secrets
from functools import partial
from pathlib import Path

from tests.faults.servicelogs import LoggingSupervisor
from tests.stack import running_stack, stack_settings

WORKERS = ("gateway", "submitter", "poller", "media")


def _lines(log_dir: Path, service: str) -> list[dict]:
    out = []
    for raw in (log_dir / f"{service}.log").read_text(errors="replace").splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line some library printed on its own
        if isinstance(line, dict):
            out.append(line)
    return out


async def test_a_request_id_follows_its_job_through_every_service(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url)
    log_dir = tmp_path / "logs"
    sent = f"client-{secrets.token_hex(6)}"
    async with running_stack(settings, supervisor_factory=partial(LoggingSupervisor, log_dir=log_dir)) as stack:
        body = {"model": "fake/default", "prompt": "a fox", "duration_s": 1}
        async with stack.session.post(f"{stack.url}/v1/jobs", json=body,
                                      headers={**stack.auth, "X-Request-Id": sent}) as resp:
            assert resp.status == 201
            echoed = resp.headers.get("X-Request-Id")
            job = await resp.json()
        done = await stack.wait_terminal(job["id"])
        async with stack.session.get(f"{stack.url}/v1/account", headers=stack.auth) as resp:
            account_id = (await resp.json())["id"]

    assert echoed == sent
    assert done["status"] == "completed"
    for service in WORKERS:
        ours = [line for line in _lines(log_dir, service) if line.get("request_id") == sent]
        assert ours, f"no log line of {service} carries the request id"
        if service != "gateway":
            assert any(line.get("job_id") == job["id"] for line in ours), service
        # Every line about the job (in the gateway: of the request that created it) names its account too.
        about_job = [line for line in _lines(log_dir, service) if line.get("job_id") == job["id"]] or ours
        assert all(line.get("account_id") == account_id for line in about_job), (service, about_job)
    access = [line for line in _lines(log_dir, "gateway")
              if line.get("logger") == "vidjobs.access" and line.get("request_id") == sent]
    assert len(access) == 1
    assert (access[0]["method"], access[0]["route"], access[0]["status"]) == ("POST", "create_job", 201)


async def test_every_response_has_an_id_and_an_error_names_it(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url)
    async with running_stack(settings) as stack:
        async with stack.session.get(f"{stack.url}/v1/jobs/job_nope", headers=stack.auth) as resp:
            missing_id, missing = resp.headers.get("X-Request-Id"), await resp.json()
        async with stack.session.get(f"{stack.url}/v1/jobs", headers={
                **stack.auth, "X-Request-Id": "has spaces and is far too odd"}) as resp:
            malformed_id = resp.headers.get("X-Request-Id")
        async with stack.session.get(f"{stack.url}/healthz") as resp:
            health_id = resp.headers.get("X-Request-Id")
        async with stack.session.get(f"{stack.url}/v1/jobs", headers={"X-Request-Id": "kept.by-us:1"}) as resp:
            unauthorized_id, unauthorized = resp.headers.get("X-Request-Id"), await resp.json()

    assert missing_id and missing_id.startswith("req_")
    assert missing["error"]["request_id"] == missing_id
    assert malformed_id and malformed_id.startswith("req_")
    assert health_id and health_id.startswith("req_")
    assert unauthorized_id == "kept.by-us:1" and unauthorized["error"]["request_id"] == "kept.by-us:1"
