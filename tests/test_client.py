"""The Python client (clients/python) against the real stack: a render followed to the end and downloaded with
its checksum checked, a cancel, errors that carry the API's code and request id, a 429 waited out, a dropped
stream resumed across a gateway crash, paging, uploads, a clip kept, released and exported to a bucket; and the
client's models kept in step with the API's own OpenAPI document, its types checked, and nothing of the server
imported."""

from __future__ import annotations

import ast
import asyncio
import hashlib
import secrets
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import msgspec
import pytest

from tests import imagefiles
from tests.gateway_harness import gateway_settings, running_gateway
from tests.s3server import TEST_BUCKET, MotoS3
from tests.stack import demo_key, host_port, running_stack, stack_settings
from vidjobs.cli.embedded import free_port
from vidjobs.common.settings import Settings
from vidjobs.gateway.app import route_table
from vidjobs.gateway.openapi import document
from vidjobs_client import (
    AsyncClient,
    AuthenticationError,
    ChecksumMismatch,
    Client,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    JobNotReady,
    NotFound,
    RateLimited,
    RetryPolicy,
    UploadRejected,
    WaitTimeout,
    models,
)

CLIENT_DIR = Path(__file__).parents[1] / "clients" / "python" / "vidjobs_client"
STAGES = ["queued", "submitted", "rendering", "downloading", "ready"]


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url)


def _in_order(seen: list[str]) -> bool:
    positions = [STAGES.index(stage) for stage in seen]
    return positions == sorted(positions) and seen[-1] == "ready"


async def test_a_render_is_followed_to_the_end_and_downloaded_with_its_checksum(settings, tmp_path):
    async with running_stack(settings) as stack:
        def render() -> tuple[models.Job, models.Job, list[str], Path, list[models.Job]]:
            with Client(stack.url, stack.key) as vj:
                created = vj.create_job("fake/default", "a red fox in snow", duration_s=2,
                                        params={"render_s": 1}, metadata={"shot": "1"})
                stages: list[str] = []
                done = vj.wait(created.id, timeout_s=60, on_change=lambda job: stages.append(job.stage))
                path = vj.download(done, tmp_path)
                twice = [vj.create_job("fake/default", "once", idempotency_key="fox-1", duration_s=1)
                         for _ in range(2)]
                return created, done, stages, path, twice

        created, done, stages, path, twice = await asyncio.to_thread(render)
        assert created.stage == "queued" and created.metadata == {"shot": "1"} and created.cost.estimated_credits > 0
        assert done.status == "completed" and done.succeeded and done.outputs is not None
        assert _in_order(stages), stages
        assert path == tmp_path / f"{done.id}.mp4"
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == done.outputs.sha256 and len(data) == done.outputs.bytes
        assert not list(tmp_path.glob("*.part"))
        # The same idempotency key answers the same job rather than a second one.
        assert twice[0].id == twice[1].id

        # Bytes that are not the file the job states are refused and not kept.
        wrong = msgspec.structs.replace(done, outputs=msgspec.structs.replace(done.outputs, sha256="0" * 64))
        with Client(stack.url, stack.key) as vj, pytest.raises(ChecksumMismatch, match="nothing was kept"):
            await asyncio.to_thread(vj.download, wrong, tmp_path / "wrong.mp4")
        assert not (tmp_path / "wrong.mp4").exists() and not (tmp_path / "wrong.mp4.part").exists()


LIVE_STAGES = ["queued", "submitted", "rendering"]


async def test_the_async_client_cancels_and_says_there_is_nothing_to_download(settings, tmp_path):
    async with running_stack(settings) as stack, AsyncClient(stack.url, stack.key) as vj:
        job = await vj.create_job("fake/default", "never ends", duration_s=1, params={"scenario": "hang"})
        seen: list[str] = []
        async for state in vj.stream_job(job.id):
            seen.append(state.stage)
            if state.stage == "rendering":
                canceled = await vj.cancel_job(job.id)
                assert canceled.status == "canceled"
        # The stream opens on the job as it is then (queued, or already submitted on a quick stack) and its
        # stages only go forward, to canceled.
        places = [LIVE_STAGES.index(stage) for stage in seen[:-1]]
        assert seen[-1] == "canceled" and places == sorted(places), seen
        assert (await vj.wait(job.id)).status == "canceled"  # an ended job: one event, then the stream closes
        with pytest.raises(JobNotReady, match="canceled"):
            await vj.download(job.id, tmp_path)
        trail = await vj.job_events(job.id)
        assert [t.to for t in trail][-1] == "canceled" and trail[0].from_ is None
        await vj.delete_job(job.id)
        with pytest.raises(NotFound) as gone:
            await vj.get_job(job.id)
        assert gone.value.code == "not_found" and gone.value.request_id and gone.value.status == 404


async def test_errors_carry_the_code_the_message_and_the_request_id(settings):
    async with running_stack(settings) as stack, AsyncClient(stack.url, stack.key) as vj:
        with pytest.raises(InvalidRequest) as bad:
            await vj.create_job("fake/default", "a fox", duration_s=600)
        assert bad.value.code == "invalid_input" and "duration_s" in bad.value.message
        assert bad.value.request_id and bad.value.request_id in str(bad.value)
        async with AsyncClient(stack.url, "vj_not_a_key") as stranger:
            with pytest.raises(AuthenticationError):
                await stranger.account()
        estimate = await vj.estimate("fake/default", "a fox", duration_s=4)
        assert estimate.affordable and estimate.estimated_credits > 0
        assert (await vj.account()).credits.available > 0


async def test_a_429_is_waited_out_as_retry_after_says(settings):
    statuses: list[int] = []

    async def record(resp: httpx.Response) -> None:
        statuses.append(resp.status_code)

    hooks = {"response": [record]}
    key = await demo_key(settings.database_url, requests_per_s=2.0, request_burst=1)
    async with running_stack(settings, key=key) as stack:
        job = await stack.create_job()
        async with AsyncClient(stack.url, key, http=httpx.AsyncClient(base_url=stack.url, event_hooks=hooks)) as vj:
            jobs = [await vj.get_job(job["id"]) for _ in range(4)]
        assert [j.id for j in jobs] == [job["id"]] * 4
        assert 429 in statuses and statuses.count(200) == 4, statuses
        # With no retries left, the refusal reaches the caller with what it said.
        async with AsyncClient(stack.url, key, retry=RetryPolicy(attempts=1)) as impatient:
            with pytest.raises(RateLimited) as limited:
                for _ in range(4):
                    await impatient.get_job(job["id"])
        assert limited.value.code == "rate_limited" and limited.value.retry_after_s and limited.value.retryable


async def test_a_stream_resumes_across_a_gateway_crash(settings):
    async with running_stack(settings) as stack, AsyncClient(stack.url, stack.key) as vj:
        job = await vj.create_job("fake/default", "slow fox", duration_s=1, params={"render_s": 6})
        seen: list[str] = []
        async for state in vj.stream_job(job.id, timeout_s=90):
            seen.append(state.stage)
            if len(seen) == 1:
                await stack.supervisor.stop("gateway", sig=signal.SIGKILL, restart=True)
        assert seen[-1] == "ready" and _in_order(seen), seen


async def test_pages_filters_and_uploads(settings, tmp_path):
    image = tmp_path / "frame.png"
    image.write_bytes(imagefiles.noise_png(64))
    async with running_stack(settings) as stack, AsyncClient(stack.url, stack.key) as vj:
        upload = await vj.upload(image)  # waits for the server to decode it
        assert upload.id.startswith("upl_") and upload.content_type == "image/png" and upload.width == 64
        assert upload.status == "ready" and upload.error is None
        with pytest.raises(UploadRejected) as rejected:
            await vj.upload(imagefiles.truncated_png(), "image/png")
        assert rejected.value.code == "image_corrupt" and "truncated" in rejected.value.message
        taken = await vj.upload(imagefiles.noise_png(16), wait=False)
        assert taken.status in ("processing", "ready") and (await vj.wait_upload(taken.id)).width == 16
        made = [await vj.create_job("fake/default", f"fox {i}", duration_s=1, input_image=upload.id if i == 0 else None,
                                    params={"scenario": "hang"}, metadata={"batch": "b1"},
                                    priority="batch" if i == 4 else "interactive") for i in range(5)]
        assert made[0].input_image == upload.id
        assert [job.priority for job in made] == ["interactive"] * 4 + ["batch"]
        listed = [job.id async for job in vj.iter_jobs(limit=2, metadata={"batch": "b1"})]
        assert listed == [job.id for job in reversed(made)]
        page = await vj.list_jobs(limit=2, status=["pending", "submitted", "processing"])
        assert len(page.data) == 2 and page.next_cursor and page.has_more
        assert [m.id for m in await vj.list_models()]  # the models the deployment renders with


async def test_webhook_secrets_are_made_rotated_and_described_without_showing_them(tmp_path, database_url,
                                                                                  nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as h:
        _, key = await h.account()
        async with AsyncClient(h.settings.gateway_url, key) as vj:
            before = await vj.webhook_secret()
            made = await vj.create_webhook_secret()
            rotated = await vj.create_webhook_secret(overlap_s=60)
            described = await vj.webhook_secret()
            endpoint = await vj.create_webhook_endpoint("https://93.184.215.14/hooks")
            endpoint_rotated = await vj.rotate_webhook_endpoint_secret(endpoint.id, overlap_s=0)
            [listed] = await vj.list_webhook_endpoints()
            with pytest.raises(InvalidRequest, match="overlap_s"):
                await vj.create_webhook_secret(overlap_s=-1)
            with pytest.raises(NotFound):
                await vj.rotate_webhook_endpoint_secret("whe_" + "0" * 26)

    assert before.created_at is None and before.previous_secret_expires_at is None
    assert made.secret.startswith("whsec_") and made.previous_secret_expires_at is None
    assert rotated.secret != made.secret and rotated.previous_secret_expires_at is not None
    assert (described.created_at, described.previous_secret_expires_at) == (rotated.created_at,
                                                                          rotated.previous_secret_expires_at)
    assert endpoint.secret and endpoint_rotated.secret != endpoint.secret
    assert listed.secret is None and listed.secret_created_at == endpoint_rotated.created_at
    assert listed.previous_secret_expires_at is None


async def test_fallbacks_are_named_per_job_or_by_the_account(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as h:
        _, key = await h.account()
        async with AsyncClient(h.settings.gateway_url, key) as vj:
            named = await vj.create_job("fake/default", "a fox", duration_s=1, fallback_models=["fake-poll/default"],
                                        max_wait_s=120)
            account = await vj.set_fallback_models(["fake-poll/default"])
            by_default = await vj.create_job("fake/default", "a fox", duration_s=1)
            none = await vj.create_job("fake/default", "a fox", duration_s=1, fallback_models=[])
            with pytest.raises(InvalidRequest, match="fallback_models"):
                await vj.set_fallback_models(["nowhere/model"])

    assert (named.fallback_models, named.max_wait_s) == (["fake-poll/default"], 120)
    assert account.fallback_models == ["fake-poll/default"] and by_default.fallback_models == ["fake-poll/default"]
    assert none.fallback_models == [] and none.max_wait_s is None


async def test_a_ready_clip_is_kept_released_and_exported_to_the_owners_bucket(
        tmp_path, database_url, nats_url, s3_server: MotoS3, customer_bucket: str, s3_client):
    settings = stack_settings(tmp_path, database_url, nats_url,
                              storage_url=f"s3://{TEST_BUCKET}/client-{secrets.token_hex(4)}",
                              export_allow_hosts=host_port(s3_server.endpoint))
    put_url, again_url = (s3_client.generate_presigned_url(
        "put_object", Params={"Bucket": customer_bucket, "Key": key}, ExpiresIn=600)
        for key in ("clips/fox.mp4", "clips/fox-again.mp4"))
    async with running_stack(settings) as stack, AsyncClient(stack.url, stack.key) as vj:
        waiting = await vj.create_job("fake/default", "never ends", duration_s=1, params={"scenario": "hang"})
        with pytest.raises(Conflict) as early:
            await vj.export_job(waiting.id, put_url, wait=True)
        with pytest.raises(Conflict) as unkeepable:
            await vj.keep_job(waiting.id)
        done = await vj.wait((await vj.create_job("fake/default", "a fox", duration_s=1,
                                                  params={"render_s": 0.2})).id, timeout_s=60)

        def keep_and_release() -> tuple[models.Job, models.Job, models.Account, models.Job, models.Account]:
            with Client(stack.url, stack.key) as sync:
                kept, again = sync.keep_job(done.id), sync.keep_job(done.id)  # a keep may be repeated
                holding = sync.account()
                released = sync.release_job(done.id)
                return kept, again, holding, released, sync.account()

        kept, again, holding, released, freed = await asyncio.to_thread(keep_and_release)
        export = await vj.export_job(done.id, put_url, wait=True, timeout_s=60)
        listed = await vj.list_exports(done.id)
        fetched = await vj.get_export(done.id, export.id)

        def export_then_wait() -> tuple[models.Export, models.Export]:
            with Client(stack.url, stack.key) as sync:
                started = sync.export_job(done.id, again_url)  # answered pending: the copy is made after
                with pytest.raises(WaitTimeout, match=f"export {started.id} was still pending after 0.1 s"):
                    sync.wait_export(started, timeout_s=0.1)  # no pause fits in 0.1 s
                return started, sync.wait_export(started, timeout_s=60)

        started, waited = await asyncio.to_thread(export_then_wait)

    assert early.value.status == 409 and early.value.code == "conflict", early.value
    assert "only a ready job's clip can be exported" in early.value.message
    assert unkeepable.value.code == "conflict"

    assert done.outputs is not None and done.outputs.retained_until is not None and not done.outputs.kept
    for job in (kept, again):
        assert job.outputs is not None and job.outputs.kept and job.outputs.retained_until is None
    assert holding.storage is not None and holding.storage.kept_jobs == 1
    assert holding.storage.used_bytes == done.outputs.bytes
    # Released, its window counts from its completion again.
    assert released.outputs is not None and not released.outputs.kept
    assert released.outputs.retained_until == done.outputs.retained_until
    assert freed.storage is not None and (freed.storage.kept_jobs, freed.storage.used_bytes) == (0, 0)

    assert export.status == "done" and not export.pending and export.reason is None, export
    assert (export.job_id, export.host, export.bytes) == (done.id, host_port(s3_server.endpoint), done.outputs.bytes)
    assert export.finished_at is not None and export.attempts == 0
    assert [e.id for e in listed] == [export.id] and listed[0] == export and fetched == export
    stored = s3_client.get_object(Bucket=customer_bucket, Key="clips/fox.mp4")["Body"].read()
    assert len(stored) == done.outputs.bytes and hashlib.sha256(stored).hexdigest() == done.outputs.sha256
    # Started without waiting, then waited for: the same export, ended.
    assert started.id == waited.id and started.id != export.id and waited.status == "done", (started, waited)
    again = s3_client.get_object(Bucket=customer_bucket, Key="clips/fox-again.mp4")["Body"].read()
    assert again == stored


def test_a_connection_that_cannot_be_made_fails_after_the_policy_s_tries():
    tries: list[str] = []
    hooks = {"request": [lambda req: tries.append(req.url.path)]}
    url = f"http://127.0.0.1:{free_port()}"
    policy = RetryPolicy(attempts=3, backoff_s=0.01)
    with Client(url, "vj_x", retry=policy, http=httpx.Client(base_url=url, event_hooks=hooks)) as vj:
        with pytest.raises(ConnectionFailed, match="after 3 tries"):
            vj.get_job("job_x")
    assert tries == ["/v1/jobs/job_x"] * 3


# Each client model and the API schema it decodes: the same fields, so neither drifts from the other.
_SCHEMAS = {
    models.Job: "JobOut", models.Outputs: "JobOutputs", models.Cost: "Cost", models.JobError: "JobError",
    models.JobUrls: "JobUrls", models.JobPage: "JobList", models.Transition: "TransitionOut",
    models.Upload: "UploadOut", models.Account: "AccountOut", models.Credits: "Credits", models.Limits: "Limits",
    models.LedgerEntry: "LedgerEntryOut", models.LedgerPage: "LedgerPage", models.Model: "ModelOut",
    models.Format: "Format", models.ModelList: "ModelList", models.Estimate: "EstimateOut",
    models.WebhookEndpoint: "EndpointCreated", models.Delivery: "DeliveryOut", models.Attempt: "AttemptOut",
    models.WebhookSecret: "WebhookSecretOut", models.NewWebhookSecret: "SecretIssued",
    models.EndpointList: "EndpointList",
    models.DeliveryList: "DeliveryList", models.Trail: "Trail", models.Usage: "UsageReport",
    models.UsageGroup: "UsageGroup", models.Storage: "StorageOut", models.Export: "ExportOut",
    models.ExportList: "ExportList",
}


def test_the_client_models_have_the_fields_the_api_documents():
    schemas = document(route_table(Settings(fake_provider="on")))["components"]["schemas"]
    for struct, name in _SCHEMAS.items():
        encoded = {field.encode_name for field in msgspec.structs.fields(struct)}
        assert encoded == set(schemas[name]["properties"]), (struct.__name__, name)
    create = set(schemas["CreateJob"]["properties"]) - {"model", "prompt"}
    assert set(models.JobOptions.__annotations__) == create
    listing = {"status", "model", "created_after", "created_before", "limit"}
    assert set(models.ListFilter.__annotations__) == listing | {"metadata"}


def test_the_client_is_documented_type_checked_and_imports_nothing_of_the_server():
    for client in (Client, AsyncClient):
        public = [name for name in vars(client) if not name.startswith("_")]
        assert not [name for name in public if not getattr(client, name).__doc__], client
    assert sorted(name for name in vars(Client) if not name.startswith("_")) == \
        sorted(name for name in vars(AsyncClient) if not name.startswith("_") and name not in ("__aenter__",))
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", str(CLIENT_DIR)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    allowed = {"httpx", "msgspec"} | sys.stdlib_module_names  # and its own modules, relatively
    for source in CLIENT_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                assert name.split(".")[0] in allowed, f"{source.name} imports {name}"


def test_the_client_builds_alone_with_only_its_own_dependencies(tmp_path):
    """`pip install ./clients/python` gives the client and nothing of the server."""
    source = shutil.copytree(CLIENT_DIR.parent, tmp_path / "source")  # the build leaves its files beside it
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                            str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("vidjobs_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        packages = {name.split("/")[0] for name in archive.namelist() if not name.startswith("vidjobs_client-")}
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        assert "vidjobs_client/py.typed" in archive.namelist()
    assert packages == {"vidjobs_client"}
    requires = sorted(line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist"))
    assert requires == ["httpx==0.28.1", "msgspec==0.23.0"]
