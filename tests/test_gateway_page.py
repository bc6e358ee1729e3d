"""The web page in a real browser (headless Chromium, driven over the DevTools protocol): a person saves a key,
renders, watches honest stages arrive live over the stream, plays the result, and finds it again after
closing the tab. Skipped where no Chromium is installed."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image

from libs.common.errors import ErrorCode, JobError
from libs.common.states import JobStatus
from libs.common.transitions import JobUpdate
from libs.providers.fake.render import ClipSpec, encode
from tests.support import wait_until
from tests.test_gateway_harness import drive, gateway_settings, running_gateway, store_outputs

CHROMIUM = next(filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None)
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI tests the web page in a real browser, and no Chromium is installed (.ci/run installs it)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")


class Browser:
    """One tab, driven by DevTools commands."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict:
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        async for msg in self._ws:
            reply = json.loads(msg.data)
            if reply.get("id") == call_id:
                assert "error" not in reply, reply
                return reply["result"]
        raise AssertionError("the browser closed the DevTools connection")

    async def js(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, what: str, within: float = 15) -> Any:
        async def check():
            return await self.js(expression)

        return await wait_until(check, within=within, what=what)

    async def open(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.until("document.readyState === 'complete'", "the page to load")


async def _devtools_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    while line := await asyncio.wait_for(proc.stderr.readline(), 30):
        if found := re.search(rb"DevTools listening on (ws://\S+)", line):
            return found.group(1).decode()
    raise AssertionError("Chromium exited before it was ready")


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--autoplay-policy=no-user-gesture-required", "--remote-debugging-port=0",
        f"--user-data-dir={tmp_path / 'chromium'}", "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        browser_url = await _devtools_url(proc)
        http_base = browser_url.split("/devtools/")[0].replace("ws://", "http://")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{http_base}/json/list") as resp:
                page = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield Browser(ws)
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 36), (200, 80, 40)).save(out, "JPEG")
    return out.getvalue()


CURRENT_STAGE = "document.querySelector('#stages li.current')?.dataset.stage"


async def test_a_person_renders_and_watches_the_stages_live(h, browser):
    account_id, key = await h.account()
    await browser.open(h.settings.gateway_url + "/")
    await browser.js(f"document.getElementById('api-key').value = {json.dumps(key)};"
                     "document.getElementById('key-form').requestSubmit()")
    await browser.js("document.getElementById('prompt').value = 'a red fox in snow';"
                     "document.getElementById('duration').value = '3';"
                     "document.getElementById('job-form').requestSubmit()")

    job_id = await browser.until("document.getElementById('job-title').textContent.match(/^job_/) && "
                                 "document.getElementById('job-title').textContent", "the job to appear")
    assert await browser.until(CURRENT_STAGE, "a stage") == "queued"
    # The workers' moves, made through the real transition function, reach the page over the stream.
    for status, stage in [(JobStatus.SUBMITTED, "submitted"), (JobStatus.PROCESSING, "rendering"),
                          (JobStatus.DOWNLOADING, "downloading")]:
        await drive(h.pool, job_id, status)
        await browser.until(f"{CURRENT_STAGE} === '{stage}'", f"the page to show {stage}")
    outputs = await store_outputs(h, account_id, job_id, video=encode(ClipSpec(320, 180, 1.0, 7)),
                                  thumbnail=_jpeg())
    await drive(h.pool, job_id, JobStatus.COMPLETED, update=JobUpdate(outputs=outputs))

    await browser.until(f"{CURRENT_STAGE} === 'ready'", "the page to show ready")
    # The browser fetched the video and thumbnail through their signed URLs.
    await browser.until("document.getElementById('video').readyState >= 1", "the video's metadata to load")
    await browser.until("document.getElementById('thumbnail').naturalWidth === 64", "the thumbnail to load")
    assert await browser.js("document.getElementById('result').hidden") is False
    assert await browser.js(f"!!document.querySelector('#jobs li[data-id=\"{job_id}\"]')")

    # Closing the tab loses nothing: a fresh visit shows the job where it stands.
    await browser.open("about:blank")
    await browser.open(h.settings.gateway_url + "/")
    await browser.until(f"document.getElementById('job-title').textContent === '{job_id}'", "the job again")
    assert await browser.until(CURRENT_STAGE, "a stage") == "ready"


async def test_a_failure_shows_its_message(h, browser):
    account_id, key = await h.account()
    _, job = await h.post_job(key)
    error = JobError.of(ErrorCode.CONTENT_REJECTED)
    await drive(h.pool, job["id"], JobStatus.FAILED, update=JobUpdate(error=error))

    await browser.open(h.settings.gateway_url + "/")
    await browser.js(f"localStorage.setItem('vidjobs.key', {json.dumps(key)}); location.reload()")
    await browser.until("document.readyState === 'complete' && document.querySelectorAll('#jobs li').length === 1",
                        "the recent jobs list")
    await browser.js("document.querySelector('#jobs li').click()")

    shown = await browser.until("document.getElementById('job-error').textContent", "the error message")
    assert shown == error.message
    assert await browser.js("document.getElementById('cancel').hidden") is True
