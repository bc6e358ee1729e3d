"""Exporting a clip through the real stack on the S3 backend: the stored original is PUT, byte for byte, to a
presigned URL of another bucket of the S3 test server, and its status is readable; a destination that names
our own network (the metadata service, a private or loopback address) is refused at once with the reason; a
destination that refuses the PUT fails the export with what it answered."""

from __future__ import annotations

import hashlib
import secrets

from tests.s3server import TEST_BUCKET, MotoS3
from tests.stack import Stack, host_port, running_stack, stack_settings
from tests.support import wait_until


async def _call(stack: Stack, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    async with stack.session.request(method, f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        return resp.status, await resp.json()


async def _finished(stack: Stack, job_id: str, export_id: str) -> dict | None:
    status, body = await _call(stack, "GET", f"/v1/jobs/{job_id}/exports/{export_id}")
    assert status == 200, body
    return body if body["status"] != "pending" else None


async def test_an_export_lands_byte_identical_in_the_owners_bucket_and_unsafe_ones_are_refused(
        tmp_path, database_url, nats_url, s3_server: MotoS3, customer_bucket: str, s3_client):
    settings = stack_settings(tmp_path, database_url, nats_url,
                              storage_url=f"s3://{TEST_BUCKET}/exports-{secrets.token_hex(4)}",
                              export_allow_hosts=host_port(s3_server.endpoint))
    put_url = s3_client.generate_presigned_url(
        "put_object", Params={"Bucket": customer_bucket, "Key": "clips/fox.mp4"}, ExpiresIn=600)
    async with running_stack(settings) as stack:
        waiting = await stack.create_job(params={"scenario": "hang"})
        status, early = await _call(stack, "POST", f"/v1/jobs/{waiting['id']}/export", {"url": put_url})
        assert status == 409 and early["error"]["code"] == "conflict", early

        job = await stack.wait_for_status((await stack.create_job(params={"render_s": 0.2}))["id"], "completed")
        status, made = await _call(stack, "POST", f"/v1/jobs/{job['id']}/export", {"url": put_url})
        assert status == 202, made
        assert made["status"] == "pending" and made["host"] == host_port(s3_server.endpoint)
        assert "url" not in made  # a credential of the owner's: never shown back
        done = await wait_until(lambda: _finished(stack, job["id"], made["id"]), within=60, what="the export")
        assert done["status"] == "done" and done["reason"] is None and done["bytes"] == job["outputs"]["bytes"], done

        # Refused when named, with the reason: our own network is never a destination.
        refusals = {}
        for url in ("https://169.254.169.254/latest/meta-data", "http://10.1.2.3/clip.mp4",
                    "https://localhost/clip.mp4", "ftp://example.com/clip.mp4",
                    "https://user:pw@example.com/clip.mp4", "https://example.com/" + "a" * 5000):
            refusals[url] = await _call(stack, "POST", f"/v1/jobs/{job['id']}/export", {"url": url})

        # A destination that refuses the PUT: its answer is the reason, and it is not tried again.
        wrong = s3_client.generate_presigned_url("put_object", Params={"Bucket": f"none-{secrets.token_hex(4)}",
                                                                       "Key": "x.mp4"}, ExpiresIn=600)
        status, doomed = await _call(stack, "POST", f"/v1/jobs/{job['id']}/export", {"url": wrong})
        assert status == 202, doomed
        failed = await wait_until(lambda: _finished(stack, job["id"], doomed["id"]), within=60, what="the failure")
        _, listed = await _call(stack, "GET", f"/v1/jobs/{job['id']}/exports")
        other = stack.as_key(await _other_key(database_url))
        hidden = await _call(other, "GET", f"/v1/jobs/{job['id']}/exports/{made['id']}")

    stored = s3_client.get_object(Bucket=customer_bucket, Key="clips/fox.mp4")["Body"].read()
    assert len(stored) == job["outputs"]["bytes"]
    assert hashlib.sha256(stored).hexdigest() == job["outputs"]["sha256"]

    metadata, private, loopback, scheme, credentials, too_long = refusals.values()
    assert metadata[0] == 422 and "link-local" in metadata[1]["error"]["message"], metadata
    assert private[0] == 422 and "VIDJOBS_EXPORT_ALLOW_HOSTS" in private[1]["error"]["message"], private
    assert loopback[0] == 422 and "not an address on the public internet" in loopback[1]["error"]["message"]
    assert scheme[0] == 422 and "ftp" in scheme[1]["error"]["message"], scheme
    assert credentials[0] == 422 and "password" in credentials[1]["error"]["message"], credentials
    assert too_long[0] == 422 and "4096" in too_long[1]["error"]["message"], too_long
    assert all(body["error"]["code"] == "invalid_input" for _, body in refusals.values())

    assert failed["status"] == "failed" and "HTTP 404" in failed["reason"], failed
    assert "NoSuchBucket" in failed["reason"] and failed["attempts"] == 1 and failed["finished_at"]
    assert [e["id"] for e in listed["data"]] == [doomed["id"], made["id"]]
    assert hidden[0] == 404


async def _other_key(database_url: str) -> str:
    from tests.stack import demo_key

    return await demo_key(database_url)
