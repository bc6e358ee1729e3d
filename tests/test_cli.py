"""`vidjobs up` and `vidjobs accounts create` as a person runs them: embedded NATS and PostgreSQL from the
wheels, nothing preinstalled, state under one data directory, Ctrl-C to stop, and a restart that resumes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import stat
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support import wait_until
from vidjobs.cli.embedded import free_port

READY = re.compile(r"vidjobs ready: (\S+) api-key=(\S+)")


def _clean_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    env["VIDJOBS_DATA_DIR"] = str(data_dir)
    return env


async def _vidjobs(*args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.cli", *args, env=env, stdout=asyncio.subprocess.PIPE,
    )


async def _ready_line(proc: asyncio.subprocess.Process) -> tuple[str, str]:
    assert proc.stdout is not None
    async with asyncio.timeout(180):
        while True:
            line = (await proc.stdout.readline()).decode()
            assert line, f"`vidjobs up` exited ({await proc.wait()}) before it was ready"
            if match := READY.search(line):
                return match.group(1), match.group(2)


async def _interrupt(proc: asyncio.subprocess.Process) -> int:
    proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(60):
        return await proc.wait()


async def test_up_runs_a_job_stops_cleanly_and_resumes(tmp_path):
    env = _clean_env(tmp_path / "state")
    port = str(free_port())
    proc = await _vidjobs("up", "--port", port, env=env)
    try:
        url, key = await _ready_line(proc)
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            body = {"model": "fake/default", "prompt": "a lighthouse at dusk", "duration_s": 1,
                    "resolution": "480p", "aspect_ratio": "16:9", "params": {"render_s": 0.2}}
            async with http.post(f"{url}/v1/jobs", json=body) as resp:
                assert resp.status == 201
                job_id = (await resp.json())["id"]

            async def completed():
                async with http.get(f"{url}/v1/jobs/{job_id}") as resp:
                    job = await resp.json()
                    return job if job["status"] == "completed" else None

            job = await wait_until(completed, within=60, what="the job to complete")
            # The demo renders what was asked (a clip of the requested size), not the tests' tiny clip.
            assert (job["outputs"]["width"], job["outputs"]["height"]) == (854, 480), job["outputs"]
            # Webhook secrets, sealed under the key `up` made and kept: the restart below must open them.
            async with http.post(f"{url}/v1/webhook-endpoints", json={"url": "https://93.184.215.14/h"}) as resp:
                assert resp.status == 201
                endpoint_id = (await resp.json())["id"]
            async with http.post(f"{url}/v1/account/webhook-secret", json={}) as resp:
                assert resp.status == 201
    finally:
        code = await _interrupt(proc)
    assert code == 0
    assert stat.S_IMODE((tmp_path / "state" / "secrets.json").stat().st_mode) == 0o600

    # A second account from the command line, while nothing is running: only the key on stdout.
    made = await _vidjobs("accounts", "create", "second", "--credits", "500", env=env)
    out, _ = await made.communicate()
    assert made.returncode == 0
    assert re.fullmatch(r"\S+\n", out.decode()), out

    again = await _vidjobs("up", "--port", port, env=env)
    try:
        url2, key2 = await _ready_line(again)
        assert key2 == key  # the demo key survives a restart
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as http:
            async with http.get(f"{url2}/v1/jobs/{job_id}") as resp:
                resumed = await resp.json()
            assert resumed["status"] == "completed"
            async with http.get(resumed["outputs"]["video_url"]) as resp:
                assert resp.status == 200
                assert hashlib.sha256(await resp.read()).hexdigest() == job["outputs"]["sha256"]
            async with http.get(f"{url2}/v1/account", headers={"Authorization": f"Bearer {out.decode().strip()}"}) as r:
                assert r.status == 200 and (await r.json())["credits"]["balance"] == 500
            # Rotating reads the current secrets (to keep them signing a while): they open after the restart.
            async with http.post(f"{url2}/v1/webhook-endpoints/{endpoint_id}/rotate-secret", json={}) as resp:
                assert resp.status == 200, await resp.text()
            async with http.post(f"{url2}/v1/account/webhook-secret", json={}) as resp:
                assert resp.status == 201, await resp.text()
    finally:
        assert await _interrupt(again) == 0


async def test_up_without_the_embedded_extra_says_what_to_install(tmp_path):
    env = _clean_env(tmp_path / "data") | {"VIDJOBS_NATS_URL": "nats://127.0.0.1:1"}
    # pgserver made unimportable, as on an install without the extra (or on arm64, where it has no wheel).
    program = ("import sys; sys.modules['pgserver'] = None; from vidjobs.cli.__main__ import main; "
               "sys.exit(main(['up']))")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", program, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()

    assert proc.returncode == 2, (out, err)
    assert "pip install 'vidjobs[embedded]'" in err.decode() and "VIDJOBS_DATABASE_URL" in err.decode()
    assert not (tmp_path / "data").exists()  # refused before anything started or was written


def test_free_ports_handed_out_together_are_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster's six ports are picked before any of its servers binds one: each pick must differ from the
    ones before it, though every one of them still looks free. (76 ports to pick from, so that repeats would
    be near certain by chance; the picks of one worker's slice of four share a range four times smaller.)"""
    from vidjobs.cli import embedded

    monkeypatch.setattr(embedded, "_ephemeral_range", lambda: (1100, 60999))
    monkeypatch.delenv(embedded.PORT_SLICE_ENV, raising=False)
    picked = [free_port() for _ in range(50)]
    assert len(set(picked)) == len(picked), sorted(picked)
