"""The web page in a real browser (headless Chromium, driven over the DevTools protocol): a person saves a key,
renders, watches honest stages arrive live over the stream, plays the result, and finds it again after
closing the tab; or, sent by a product with a browser token in the link, watches (and perhaps starts) their
own jobs and is asked for a new link once the token dies. Skipped where no Chromium is installed."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from PIL import Image

from tests.gateway_harness import (
    Harness,
    auth,
    decode_upload,
    drive,
    gateway_settings,
    running_gateway,
    store_outputs,
)
from tests.support import wait_until
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate
from vidjobs.fakeprovider.clips import ClipSpec, encode
from vidjobs.gateway import accounts, browsertokens

CHROMIUM = next(filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None)
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI tests the web page in a real browser, and no Chromium is installed (.ci/run installs it)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")


class Browser:
    """One tab, driven by DevTools commands."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self._ws = ws
        self._ids = itertools.count(1)
        self._events: list[dict] = []  # DevTools events that arrived while a reply was awaited

    async def send(self, method: str, **params: Any) -> dict:
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        async for msg in self._ws:
            reply = json.loads(msg.data)
            if reply.get("id") == call_id:
                assert "error" not in reply, reply
                return reply["result"]
            if "method" in reply:
                self._events.append(reply)
        raise AssertionError("the browser closed the DevTools connection")

    async def event(self, method: str, within: float = 10) -> dict:
        """The next DevTools event named `method` (its domain must be enabled)."""
        async with asyncio.timeout(within):
            while True:
                for found in self._events:
                    if found["method"] == method:
                        self._events.remove(found)
                        return found["params"]
                msg = await self._ws.receive()
                assert msg.type == aiohttp.WSMsgType.TEXT, msg
                if "method" in (event := json.loads(msg.data)):
                    self._events.append(event)

    async def js(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, what: str, within: float = 15) -> Any:
        """The expression's value once truthy. One that throws counts as not yet: a page just navigated to
        may still be the one before it, or have no element the expression names yet."""
        async def check():
            result = await self.send("Runtime.evaluate", expression=expression, awaitPromise=True,
                                     returnByValue=True)
            return None if "exceptionDetails" in result else result["result"].get("value")

        return await wait_until(check, within=within, what=what)

    async def open(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.until("document.readyState === 'complete'", "the page to load")

    async def sign_in(self, base_url: str, key: str) -> None:
        """The page, opened with `key` already saved, as on a person's second visit."""
        await self.open(base_url + "/")
        await self.js(f"localStorage.setItem('vidjobs.key', {json.dumps(key)})")
        await self.open(base_url + "/")

    async def choose_file(self, selector: str, path: Path) -> None:
        """Set a file on a file input as a person choosing it would (the page sees a change event)."""
        found = await self.send("Runtime.evaluate", expression=f"document.querySelector({json.dumps(selector)})")
        await self.send("DOM.setFileInputFiles", files=[str(path)], objectId=found["result"]["objectId"])

    async def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.send("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                            windowsVirtualKeyCode=13, **({"text": "\r"} if kind == "keyDown" else {}))


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
                tab = Browser(ws)
                # A headless tab never has the window's focus, and without it focus() fires no focus events.
                await tab.send("Emulation.setFocusEmulationEnabled", enabled=True)
                yield tab
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


@pytest.fixture
async def h_runway(tmp_path, database_url, nats_url):
    """A gateway that also offers Runway's models (listed from the adapter's tables; nothing is sent to Runway)."""
    settings = gateway_settings(tmp_path, database_url, nats_url, runway_api_key="rw-test",
                                runway_url="http://runway.invalid")
    async with running_gateway(settings) as harness:
        yield harness


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 36), (200, 80, 40)).save(out, "JPEG")
    return out.getvalue()


CURRENT_STAGE = "document.querySelector('#stages li.current')?.dataset.stage"
# The stages a screen reader is told are the current step: exactly the one shown as current.
STEP = "[...document.querySelectorAll('#stages li[aria-current=\"step\"]')].map(li => li.dataset.stage)"


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
    # Waiting, it says where it stands and, with no render of the model measured yet, that there is no estimate.
    waiting = await browser.until("document.getElementById('job-status').textContent", "the status line")
    assert "number 1 in your queue" in waiting
    assert "0 jobs ahead; no estimate yet: no renders of fake/default" in waiting
    # The workers' moves, made through the real transition function, reach the page over the stream.
    for status, stage in [(JobStatus.SUBMITTED, "submitted"), (JobStatus.PROCESSING, "rendering"),
                          (JobStatus.DOWNLOADING, "downloading")]:
        await drive(h.pool, job_id, status)
        await browser.until(f"{CURRENT_STAGE} === '{stage}'", f"the page to show {stage}")
        assert await browser.js(STEP) == [stage]
    outputs = await store_outputs(h, account_id, job_id, video=encode(ClipSpec(320, 180, 1.0, 7)),
                                  thumbnail=_jpeg())
    await drive(h.pool, job_id, JobStatus.COMPLETED, update=JobUpdate(actual_credits=30), outputs=outputs)

    await browser.until(f"{CURRENT_STAGE} === 'ready'", "the page to show ready")
    assert await browser.js(STEP) == ["ready"]
    estimated = (await h.get(key, f"/v1/jobs/{job_id}"))[1]["cost"]["estimated_credits"]
    assert await browser.until("document.getElementById('job-cost').textContent", "the cost") == (
        f"Cost: 30 credits charged ({estimated} were reserved).")
    # The browser fetched the video and thumbnail through their signed URLs.
    await browser.until("document.getElementById('video').readyState >= 1", "the video's metadata to load")
    await browser.until("document.getElementById('thumbnail').naturalWidth === 64", "the thumbnail to load")
    assert await browser.js("document.getElementById('result').hidden") is False
    assert await browser.js(f"!!document.querySelector('#jobs li[data-id=\"{job_id}\"]')")
    # The stream was opened with a token minted for this job, read-only; the key itself was in no URL.
    minted = await h.pool.fetch("SELECT scopes, job_ids, issuer_kind FROM browser_tokens WHERE account_id = $1",
                                account_id)
    assert [tuple(r) for r in minted] == [(["read"], [job_id], "api_key")]
    urls = await browser.js("[location.href, ...performance.getEntriesByType('resource').map(e => e.name)]")
    assert not [url for url in urls if key in url]

    # Closing the tab loses nothing: a fresh visit shows the job where it stands.
    await browser.open("about:blank")
    await browser.open(h.settings.gateway_url + "/")
    await browser.until(f"document.getElementById('job-title').textContent === '{job_id}'", "the job again")
    assert await browser.until(CURRENT_STAGE, "a stage") == "ready"


async def _renders_measured_earlier(h: Harness, like: str, seconds: list[float]) -> None:
    """Completed renders of `like`'s model from an hour ago, each `seconds` from start to ready, as the
    measurements read them."""
    await h.pool.execute("""
        INSERT INTO jobs (id, account_id, model, provider, request, estimated_credits, actual_credits, status, stage,
                          submitted_at, rendered_at, completed_at)
        SELECT 'job_earlier' || n, j.account_id, j.model, j.provider, j.request, j.estimated_credits,
               j.estimated_credits, 'completed', 'ready', now() - interval '1 hour',
               now() - interval '1 hour' + make_interval(secs => s - 1),
               now() - interval '1 hour' + make_interval(secs => s)
        FROM jobs j, unnest($2::float8[]) WITH ORDINALITY AS h (s, n) WHERE j.id = $1""", like, seconds)


async def test_a_rendering_job_says_when_it_is_ready_and_a_retry_keeps_its_stage(h, browser):
    """A render under way says when it is likely to be ready, from its model's measured renders; sent round again
    after a transient failure, it stays at the stage it had reached and says which attempt it is on and why."""
    _, key = await h.account()
    _, job = await h.post_job(key)
    await _renders_measured_earlier(h, job["id"], [60, 70, 80, 90, 100])
    await browser.open(h.settings.gateway_url + "/")
    await browser.js(f"localStorage.setItem('vidjobs.key', {json.dumps(key)});"
                     f"localStorage.setItem('vidjobs.job', {json.dumps(job['id'])})")
    await browser.open(h.settings.gateway_url + "/")
    status = "document.getElementById('job-status').textContent"

    await drive(h.pool, job["id"], JobStatus.SUBMITTED, JobStatus.PROCESSING,
                update=JobUpdate(submitted_at=datetime.now(UTC)))
    await browser.until(f"{CURRENT_STAGE} === 'rendering'", "the page to show rendering")
    said = await browser.until(f"{status}.includes('ready in about') && {status}", "when it is likely ready")
    assert re.search(r"^rendering · ready in about 1–2 min · updated ", said), said

    busy = JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The render node ran out of GPU memory; try again.")
    await drive(h.pool, job["id"], JobStatus.RETRYING, update=JobUpdate(error=busy, retry_at=datetime.now(UTC)))
    said = await browser.until(f"{status}.includes('ended') && {status}", "the retry")
    assert said.startswith(f"rendering · attempt 1 of 3 ended: {busy.message} · updated "), said
    await drive(h.pool, job["id"], JobStatus.PENDING, update=JobUpdate(attempt=2, error=None))
    said = await browser.until(f"{status}.includes('attempt 2') && {status}", "the second attempt")
    assert said.startswith(f"rendering · attempt 2 of 3; the last try ended: {busy.message} · "), said
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, update=JobUpdate(submitted_at=datetime.now(UTC)))
    await browser.until(f"{status}.includes('ready in about')", "the second attempt's range")
    # Queued again and submitted again, it showed its stage all along and never went back to an earlier one.
    assert await browser.js(CURRENT_STAGE) == "rendering" and await browser.js(STEP) == ["rendering"]
    assert await browser.js("[...document.querySelectorAll('#stages li.done')].map(li => li.dataset.stage)") == [
        "queued", "submitted"]


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
    assert await browser.js("document.getElementById('job-error-code').textContent") == "content_rejected"
    assert "Change the prompt" in await browser.js("document.getElementById('job-advice').textContent")
    assert await browser.js("document.getElementById('cancel').hidden") is True


def _png(path: Path, size: tuple[int, int] = (96, 54)) -> Path:
    Image.new("RGB", size, (40, 120, 200)).save(path, "PNG")
    return path


async def _completed(h: Harness, account_id: str, key: str, prompt: str) -> dict:
    """A job that rendered, with a real thumbnail and a real (playable) preview in storage."""
    _, job = await h.post_job(key, prompt=prompt)
    outputs = await store_outputs(h, account_id, job["id"], video=encode(ClipSpec(320, 180, 1.0, 7)),
                                  thumbnail=_jpeg(), preview=encode(ClipSpec(160, 90, 1.0, 7)))
    clip = msgspec.structs.replace(outputs.preview, width=160, height=90, duration_s=1.0)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, JobStatus.PROCESSING, JobStatus.DOWNLOADING,
                JobStatus.COMPLETED, update=JobUpdate(actual_credits=10),
                outputs=msgspec.structs.replace(outputs, preview=clip))
    return (await h.get(key, f"/v1/jobs/{job['id']}"))[1]


def _item(job_id: str) -> str:
    return f"document.querySelector('#jobs li[data-id=\"{job_id}\"]')"


LISTED = "document.querySelectorAll('#jobs li').length"


async def _select(browser: Browser, select_id: str, value: str) -> None:
    """Pick `value` in a <select>, as a person would (the page hears the change)."""
    await browser.js(f"(s => {{ s.value = {json.dumps(value)}; s.dispatchEvent(new Event('change')); }})"
                     f"(document.getElementById({json.dumps(select_id)}))")


async def _render(browser: Browser, prompt: str, *, previous: str = "") -> str:
    """Press Render with `prompt`; the id of the new job the page then shows (not `previous`)."""
    await browser.js(f"document.getElementById('prompt').value = {json.dumps(prompt)};"
                     "document.getElementById('job-form').requestSubmit()")
    title = "document.getElementById('job-title').textContent"
    return await browser.until(f"{title}.match(/^job_/) && {title} !== '{previous}' && {title}", "the job to appear")


async def test_an_image_is_uploaded_previewed_and_sent_as_input_image(h, browser, tmp_path):
    account_id, key = await h.account()
    await browser.sign_in(h.settings.gateway_url, key)

    await browser.choose_file("#image", _png(tmp_path / "start.png"))
    await browser.until("document.getElementById('image-preview').naturalWidth === 96", "the preview")
    status = "document.getElementById('image-status').textContent"
    # Taken, and waiting for the media worker (none runs beside this gateway until the test plays it).
    await browser.until(f"{status} === 'checking the image…'", "the upload to be taken")
    upload_id = await h.pool.fetchval("SELECT id FROM uploads WHERE account_id = $1", account_id)
    assert upload_id.startswith("upl_")
    await decode_upload(h, upload_id)
    assert await browser.until(f"{status}.startsWith('uploaded') && {status}", "the upload") == "uploaded (96×54)"
    job_id = await _render(browser, "the picture, moving")

    assert (await h.get(key, f"/v1/jobs/{job_id}"))[1]["input_image"] == upload_id


async def test_a_refused_image_says_why_and_nothing_is_rendered(h, browser, tmp_path):
    account_id, key = await h.account()
    await browser.sign_in(h.settings.gateway_url, key)
    fake = tmp_path / "not-really.png"
    fake.write_text("this is text, not a picture")

    await browser.choose_file("#image", fake)
    status = await browser.until("document.getElementById('image-status').textContent.startsWith('not accepted') "
                                 "&& document.getElementById('image-status').textContent", "the refusal")
    await browser.js("document.getElementById('prompt').value = 'x';"
                     "document.getElementById('job-form').requestSubmit()")

    shown = await browser.until("document.getElementById('form-error').textContent", "the form's error")
    assert shown.startswith("The image was not accepted:") and status.removeprefix("not accepted: ") in shown
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account_id) == 0


async def test_the_model_picker_offers_what_each_model_renders(h_runway, browser):
    h = h_runway
    _, key = await h.account()
    listed = [m["id"] for m in (await h.get(key, "/v1/models"))[1]["data"]]
    await browser.sign_in(h.settings.gateway_url, key)

    options = "[...document.getElementById('model').options].map(o => o.value)"
    assert await browser.until(f"{options}.length > 1 && {options}", "the models") == listed
    assert "runway/veo3.1" in listed and "fake-poll/default" in listed
    # Runway's veo3.1 renders 4, 6 or 8-second clips only and, as we offer it, takes no seed.
    await _select(browser, "model", "runway/veo3.1")
    assert await browser.js("[...document.getElementById('duration').options].map(o => o.value)") == ["4", "6", "8"]
    assert await browser.js("document.getElementById('seed').disabled") is True

    await _select(browser, "model", "fake-poll/default")
    assert await browser.js("document.getElementById('duration').options.length") == 60
    job_id = await _render(browser, "polled")
    assert (await h.get(key, f"/v1/jobs/{job_id}"))[1]["model"] == "fake-poll/default"


async def test_seed_and_negative_prompt_are_sent_and_empty_means_none(h, browser):
    _, key = await h.account()
    await browser.sign_in(h.settings.gateway_url, key)
    await browser.until("document.getElementById('model').options.length > 1", "the models")

    await browser.js("document.getElementById('seed').value = '42';"
                     "document.getElementById('negative-prompt').value = 'blurry, text'")
    seeded = await _render(browser, "with a seed")
    await browser.js("document.getElementById('seed').value = '';"
                     "document.getElementById('negative-prompt').value = ''")
    plain = await _render(browser, "without", previous=seeded)

    job = (await h.get(key, f"/v1/jobs/{seeded}"))[1]
    assert (job["seed"], job["negative_prompt"]) == (42, "blurry, text")
    job = (await h.get(key, f"/v1/jobs/{plain}"))[1]
    assert (job["seed"], job["negative_prompt"]) == (None, None)


async def test_the_list_pages_with_more_and_filters_by_status(h, browser):
    _, key = await h.account(concurrency=20)
    created = [(await h.post_job(key, prompt=f"job {n}"))[1]["id"] for n in range(12)]
    await drive(h.pool, created[0], JobStatus.FAILED, update=JobUpdate(error=JobError.of(ErrorCode.TIMEOUT)))
    await browser.sign_in(h.settings.gateway_url, key)

    assert await browser.until(f"{LISTED} === 10 && {LISTED}", "the first page") == 10
    await browser.js("document.getElementById('more').click()")
    await browser.until(f"{LISTED} === 12", "the second page")
    shown = await browser.js("[...document.querySelectorAll('#jobs li')].map(li => li.dataset.id)")
    assert shown == created[::-1]  # newest first, each once
    assert await browser.js("document.getElementById('more').hidden") is True

    await _select(browser, "status-filter", "failed")
    await browser.until(f"{LISTED} === 1", "only the failed job")
    assert await browser.js(f"!!{_item(created[0])}")
    await _select(browser, "status-filter", "completed")
    await browser.until("!document.getElementById('jobs-empty').hidden", "no completed jobs")
    assert await browser.js(LISTED) == 0


async def test_delete_asks_first_then_removes_the_job(h, browser):
    _, key = await h.account()
    _, kept = await h.post_job(key, prompt="kept")
    _, doomed = await h.post_job(key, prompt="doomed")
    await browser.sign_in(h.settings.gateway_url, key)
    await browser.until(f"{LISTED} === 2", "the list")
    await browser.send("Page.enable")
    press_delete = f"setTimeout(() => {_item(doomed['id'])}.querySelector('.delete').click())"

    # Declining the confirmation leaves everything as it was.
    await browser.js(press_delete)
    await browser.event("Page.javascriptDialogOpening")
    await browser.send("Page.handleJavaScriptDialog", accept=False)
    assert await browser.js(LISTED) == 2
    assert (await h.get(key, f"/v1/jobs/{doomed['id']}"))[0] == 200

    await browser.js(press_delete)
    assert doomed["id"] in (await browser.event("Page.javascriptDialogOpening"))["message"]
    await browser.send("Page.handleJavaScriptDialog", accept=True)
    await browser.until(f"{LISTED} === 1", "the job to leave the list")
    assert await browser.js(f"!!{_item(kept['id'])}")
    assert (await h.get(key, f"/v1/jobs/{doomed['id']}"))[0] == 404


async def test_completed_jobs_show_a_thumbnail_a_hover_preview_and_a_download(h, browser):
    account_id, key = await h.account()
    job = await _completed(h, account_id, key, "a finished fox")
    await browser.sign_in(h.settings.gateway_url, key)
    item = _item(job["id"])
    await browser.until(f"{item}?.querySelector('.thumb img')?.naturalWidth === 64", "the thumbnail to load")

    # The download link fetches the stored video itself.
    link = await browser.js(f"({{href: {item}.querySelector('a.download').href, "
                            f"name: {item}.querySelector('a.download').getAttribute('download')}})")
    assert link["name"] == f"{job['id']}.mp4"
    assert link["href"].split("?")[0] == job["outputs"]["video_url"].split("?")[0]
    fetched = await browser.js(f"fetch({json.dumps(link['href'])}).then(r => r.arrayBuffer()).then(b => b.byteLength)")
    assert fetched == job["outputs"]["bytes"]

    # Keyboard focus plays the preview, muted, in place; leaving stops it.
    await browser.js(f"{item}.querySelector('.open').focus()")
    preview = f"{item}.querySelector('.thumb video')"
    await browser.until(f"{preview} && !{preview}.paused && {preview}.currentTime > 0", "the preview to play")
    assert await browser.js(f"[{preview}.muted, {preview}.src.split('?')[0]]") == [
        True, job["outputs"]["preview_url"].split("?")[0]]
    await browser.js(f"{item}.querySelector('.open').blur()")
    await browser.until(f"{preview}.paused", "the preview to stop")
    # So does the mouse.
    box = await browser.js(f"(r => [r.x + r.width / 2, r.y + r.height / 2])({item}.querySelector('.thumb')"
                           ".getBoundingClientRect())")
    await browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
    await browser.until(f"!{preview}.paused", "the preview to play under the mouse")
    await browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=0, y=0)
    await browser.until(f"{preview}.paused", "the preview to stop when the mouse leaves")

    # Enter on the focused item opens the job.
    await browser.js(f"{item}.querySelector('.open').focus()")
    await browser.press_enter()
    await browser.until(f"document.getElementById('job-title').textContent === '{job['id']}'", "the job to open")
    shown = await browser.js("document.getElementById('download').getAttribute('href')")
    assert shown.split("?")[0] == job["outputs"]["video_url"].split("?")[0]  # signed afresh on each read


async def test_a_failed_job_says_what_to_do_and_is_still_there_after_returning(h, browser):
    _, key = await h.account()
    _, job = await h.post_job(key)
    error = JobError.of(ErrorCode.TIMEOUT)  # retryable: the advice is to try again
    await drive(h.pool, job["id"], JobStatus.FAILED, update=JobUpdate(error=error))
    await browser.sign_in(h.settings.gateway_url, key)
    await browser.until(f"!!{_item(job['id'])}", "the list")
    await browser.js(f"{_item(job['id'])}.querySelector('.open').click()")
    await browser.until("document.getElementById('job-error-code').textContent === 'timeout'", "the error code")

    await browser.open("about:blank")
    await browser.open(h.settings.gateway_url + "/")

    await browser.until(f"document.getElementById('job-title').textContent === '{job['id']}'", "the job again")
    shown = await browser.until("document.getElementById('job-error-code').textContent === 'timeout' && "
                                "[document.getElementById('job-error').textContent, "
                                "document.getElementById('job-advice').textContent]", "the failure again")
    assert shown[0] == error.message
    assert shown[1].startswith("The render ran past its deadline. Try again")
    assert await browser.js(f"{CURRENT_STAGE} ?? null") is None
    assert await browser.js(STEP) == []


async def test_render_again_reruns_the_job_shown_and_follows_the_new_one(h, browser):
    _, key = await h.account()
    _, job = await h.post_job(key, prompt="a heron taking off")
    error = JobError.of(ErrorCode.RENDER_TIMEOUT, "The provider did not finish the render within 90 s.")
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, JobStatus.FAILED, update=JobUpdate(error=error))
    await browser.sign_in(h.settings.gateway_url, key)
    await browser.until(f"!!{_item(job['id'])}", "the list")
    assert await browser.js("document.getElementById('rerun').hidden") is True  # no job shown yet
    await browser.js(f"{_item(job['id'])}.querySelector('.open').click()")
    await browser.until("document.getElementById('job-error-code').textContent === 'render_timeout'", "the error")
    assert "Render again" in await browser.js("document.getElementById('job-advice').textContent")

    await browser.js("document.getElementById('rerun').click()")
    title = "document.getElementById('job-title').textContent"
    again = await browser.until(f"{title} !== '{job['id']}' && {title}.match(/^job_/) && {title}", "the new job")
    _, shown = await h.get(key, f"/v1/jobs/{again}")
    assert (shown["rerun_of"], shown["prompt"]) == (job["id"], "a heron taking off")
    assert await browser.until("document.getElementById('job-rerun-of').textContent", "the link") == \
        f"Renders {job['id']} again."
    assert await browser.until(f"{CURRENT_STAGE} === 'queued'", "the new job followed")
    assert await browser.js("[document.getElementById('rerun').hidden, document.getElementById('cancel').hidden]") \
        == [True, False]  # a live job is canceled, not rendered again
    await browser.until(f"!!{_item(again)}", "the new job in the list")
    assert await browser.js("localStorage.getItem('vidjobs.job')") == again


# ---- a link with a browser token (/#token=vjt_…&job=job_…) -------------------------------------------------

# Every use the page's scripts make of localStorage, recorded from before they run.
_LOCAL_STORAGE_SPY = """
window.localStorageUse = [];
for (const name of ["getItem", "setItem", "removeItem", "clear", "key"]) {
  const real = Storage.prototype[name];
  Storage.prototype[name] = function (...args) {
    if (this === window.localStorage) window.localStorageUse.push([name, ...args]);
    return real.apply(this, args);
  };
}
"""
REFUSED = "document.getElementById('link-refused')"
SHOWN = "['key-section', 'create-section', 'job', 'list-section'].filter(id => !document.getElementById(id).hidden)"


async def _token(h: Harness, key: str, scopes: list[str], jobs: list[str] | None = None) -> dict:
    """A browser token, as a product's backend mints one for a person (POST /v1/account/tokens)."""
    resp = await h.client.post("/v1/account/tokens", json={"scopes": scopes, "jobs": jobs, "ttl_s": 600},
                               headers=auth(key))
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def test_a_link_follows_its_job_live_and_keeps_no_key(h, browser):
    account_id, key = await h.account()
    _, job = await h.post_job(key, prompt="a fox, sent by the app")
    job_id = job["id"]
    token = (await _token(h, key, ["read"], jobs=[job_id]))["token"]
    await browser.send("Page.enable")
    await browser.send("Page.addScriptToEvaluateOnNewDocument", source=_LOCAL_STORAGE_SPY)

    await browser.open(f"{h.settings.gateway_url}/#token={token}&job={job_id}")
    await browser.until(f"document.getElementById('job-title').textContent === '{job_id}'", "the linked job")
    assert await browser.until(CURRENT_STAGE, "a stage") == "queued"
    # The token left the address bar at once (no history entry holds it), and nothing asks for a key.
    assert await browser.js("[location.href, location.hash, history.length]") == [
        h.settings.gateway_url + "/", "", 2]
    assert await browser.js(SHOWN) == ["job", "list-section"]
    assert await browser.js("document.getElementById('credits').textContent") == ""
    # The workers' moves reach the page over the stream the token opened.
    for status, stage in [(JobStatus.SUBMITTED, "submitted"), (JobStatus.PROCESSING, "rendering"),
                          (JobStatus.DOWNLOADING, "downloading")]:
        await drive(h.pool, job_id, status)
        await browser.until(f"{CURRENT_STAGE} === '{stage}'", f"the page to show {stage}")
    outputs = await store_outputs(h, account_id, job_id, video=encode(ClipSpec(320, 180, 1.0, 7)),
                                  thumbnail=_jpeg())
    await drive(h.pool, job_id, JobStatus.COMPLETED, update=JobUpdate(actual_credits=30), outputs=outputs)
    await browser.until(f"{CURRENT_STAGE} === 'ready'", "the page to show ready")
    await browser.until("document.getElementById('thumbnail').naturalWidth === 64", "the thumbnail to load")
    # What a token may not do is not offered: the token may not cancel, render again or delete.
    assert await browser.js("[document.getElementById('cancel').hidden, document.getElementById('rerun').hidden, "
                            "document.querySelectorAll('#jobs .delete').length]") == [True, True, 0]
    # Limited to its job, it may not list the account's: the list is the link's job.
    await browser.until(f"{LISTED} === 1 && !!{_item(job_id)}", "the linked job in the list")

    assert await browser.js("window.localStorageUse") == []

    # A reload keeps the link for this tab; the page still holds no key, and never touched localStorage.
    await browser.open(h.settings.gateway_url + "/")
    await browser.until(f"{CURRENT_STAGE} === 'ready'", "the job again after a reload")
    assert await browser.js("[window.localStorageUse, localStorage.length]") == [[], 0]
    assert json.loads(await browser.js("sessionStorage.getItem('vidjobs.link')"))["token"] == token


async def _asks_for_a_new_link(browser: Browser) -> None:
    shown = await browser.until(f"!{REFUSED}.hidden && {REFUSED}.innerText", "the page to ask for a new link")
    assert "no longer valid" in shown and "Ask the app for a new link." in shown
    assert await browser.js(SHOWN) == []  # nothing else: no key form, no form, no job, no list


async def test_an_expired_or_revoked_link_asks_for_a_new_one(h, browser):
    account_id, key = await h.account()
    _, job = await h.post_job(key)
    minted = await _token(h, key, ["read"], jobs=[job["id"]])
    # The same grant, as its link reads once its signed expiry has passed.
    expired = browsertokens.sign(h.settings, browsertokens.Claims(minted["id"], account_id, int(time.time()) - 1))
    await browser.open(f"{h.settings.gateway_url}/#token={expired}&job={job['id']}")
    await _asks_for_a_new_link(browser)

    # Alive, but the key that minted it was revoked since.
    revoked = await _token(h, key, ["read"], jobs=[job["id"]])
    await accounts.revoke_key(h.pool, (await accounts.list_keys(h.pool, account_id))[0].id)
    await browser.open("about:blank")
    await browser.open(f"{h.settings.gateway_url}/#token={revoked['token']}&job={job['id']}")
    await _asks_for_a_new_link(browser)


async def test_a_read_only_link_cannot_create_and_a_creating_one_can(h, browser):
    account_id, key = await h.account()
    read_only = await _token(h, key, ["read"])
    await browser.open(f"{h.settings.gateway_url}/#token={read_only['token']}")
    note = "document.getElementById('link-no-create')"
    assert "cannot start new ones" in await browser.until(f"!{note}.hidden && {note}.textContent", "why not")
    assert await browser.js("[document.getElementById('create-section').hidden, "
                            "document.getElementById('render').disabled]") == [True, True]
    # Even submitted by a script, the form sends nothing.
    await browser.js("document.getElementById('prompt').value = 'x';"
                     "document.getElementById('job-form').requestSubmit()")
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account_id) == 0

    # The app links the same tab to a token that may create (only the fragment changes): the form is offered,
    # and the job it makes is followed and listed, though the token names no job of its own.
    creating = await _token(h, key, ["read", "create"], jobs=[])
    await browser.send("Page.navigate", url=f"{h.settings.gateway_url}/#token={creating['token']}")
    # (The link's section is shown as the script starts, the form once the token is known to create.)
    await browser.until("!document.getElementById('link-section').hidden && "
                        "!document.getElementById('create-section').hidden", "the form")
    assert await browser.js(f"{note}.hidden") is True
    # Without `upload`, it takes no image.
    assert await browser.js("[document.getElementById('image').disabled, "
                            "document.getElementById('image-need').textContent]") == [
        True, "(this link cannot upload images)"]
    job_id = await _render(browser, "made through a link")
    assert (await h.get(key, f"/v1/jobs/{job_id}"))[1]["prompt"] == "made through a link"
    assert await browser.until(CURRENT_STAGE, "the new job followed") == "queued"
    await browser.until(f"!!{_item(job_id)}", "the new job in the list")
