"""The TypeScript client (clients/typescript, the npm package @vidjobs/client) against the real stack.

Its types are generated from the gateway's OpenAPI document, and are held to it here, both to the document the
gateway's code makes and to the one a running gateway serves. Its own tests (`node --test`, compiled from
clients/typescript/test) run against a stack this test starts: every route a product uses, answered 2xx at least
once (held here to the document's list), a job followed to completion, a stream cut mid-job that still ends at
the final state, a 429 retried, real webhook deliveries verified, the packed tarball installed into an empty
project, and the bundles' sizes held to their budget. The package installs and builds itself (`npm ci`, `tsc`);
the tests are skipped, saying why, only where there is no Node. And a page built from the package with its React
hooks runs in Chromium (as tests/test_gateway_page.py drives it), showing a job go from queued to ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web

from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.support import wait_until
from tests.test_gateway_page import CHROMIUM, Browser, browser  # noqa: F401 (the page test's browser fixture)
from vidjobs.cli import platforms
from vidjobs.cli.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clients" / "typescript"
NODE = shutil.which("node")
NPM = shutil.which("npm")


def _node_major() -> int:
    if NODE is None:
        return 0
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
    return int(version.lstrip("v").split(".")[0] or 0)


NODE_MAJOR = _node_major()
needs_node = pytest.mark.skipif(
    NODE is None or NPM is None or NODE_MAJOR < 20,
    reason=f"the TypeScript client's tests need Node 20+ and npm; this machine has "
           f"{'no node' if NODE is None else f'Node {NODE_MAJOR}'}{'' if NPM else ' and no npm'}")


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_types", PACKAGE / "scripts" / "gen_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time on this machine (tests on other workers build the same folder)."""
    with open(Path(tempfile.gettempdir()) / "vidjobs-typescript-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(*command: str, timeout: float = 300) -> str:
    out = subprocess.run(command, cwd=PACKAGE, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(command)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out.stdout


def _sources_changed_at() -> float:
    sources = [*(PACKAGE / "src").rglob("*"), *(PACKAGE / "test").rglob("*"), *PACKAGE.glob("*.json")]
    return max(p.stat().st_mtime for p in sources if p.is_file())


def build() -> Path:
    """The package installed at its locked versions (`npm ci`, when node_modules is missing or older than the
    lock) and compiled: dist/ (the package), build/ (its tests and the test page's bundle). Built once for its
    sources as they are: a test on another worker may be running what was built, which is not written again."""
    with _build_lock():
        installed = PACKAGE / "node_modules" / ".package-lock.json"
        if not installed.exists() or installed.stat().st_mtime < (PACKAGE / "package-lock.json").stat().st_mtime:
            _run("npm", "ci", "--no-audit", "--no-fund")
        stamp = PACKAGE / "build" / ".built"
        if not stamp.exists() or stamp.stat().st_mtime < _sources_changed_at():
            _run("npm", "run", "--silent", "build")
            stamp.touch()
    return PACKAGE


def test_the_generated_types_are_the_gateway_s_openapi_document() -> None:
    gen = generator()
    expected = gen.render(gen.gateway_document())
    assert (PACKAGE / "src" / "types.gen.ts").read_text() == expected, (
        "clients/typescript/src/types.gen.ts differs from the gateway's OpenAPI document: regenerate it with "
        "`python clients/typescript/scripts/gen_types.py`")


async def _platform_key(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        scopes = ["accounts", "credits", "keys", "tokens", "usage", "act"]
        return str((await platforms.create(conn, "tsapp", scopes))[1])
    finally:
        await conn.close()


def _figures(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            found[entry["name"]] = entry["value"]
    return found


@needs_node
async def test_the_client_against_the_real_stack(tmp_path: Path, database_url: str, nats_url: str) -> None:
    await asyncio.to_thread(build)
    hooks_port, export_port = free_port(), free_port()
    settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{hooks_port}",
                              export_allow_hosts=f"127.0.0.1:{export_port}")
    # One request a burst, the next allowed 4 s later: long enough that a loaded machine's pause between the
    # test's first request and its create never lets the create through unrefused.
    slow_key = await demo_key(database_url, requests_per_s=0.25, request_burst=1)
    platform_key = await _platform_key(database_url)
    routes_file, figures_file = tmp_path / "routes.txt", tmp_path / "figures.jsonl"
    async with running_stack(settings) as stack:
        async with stack.session.get(f"{stack.url}/openapi.json") as resp:
            served = await resp.json()
        env = {**os.environ, "VIDJOBS_URL": stack.url, "VIDJOBS_API_KEY": stack.key,
               "VIDJOBS_PLATFORM_KEY": platform_key, "VIDJOBS_SLOW_KEY": slow_key,
               "VIDJOBS_HOOKS_PORT": str(hooks_port), "VIDJOBS_EXPORT_URL": f"http://127.0.0.1:{export_port}",
               "VIDJOBS_ROUTES_FILE": str(routes_file), "VIDJOBS_FIGURES_FILE": str(figures_file),
               "VIDJOBS_SCRATCH": str(tmp_path / "scratch")}
        files = sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "build" / "test").glob("*.test.js"))
        proc = await asyncio.create_subprocess_exec(
            "node", "--test", "--test-concurrency=4", *files, cwd=PACKAGE, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    text = output.decode(errors="replace")
    print(text[-3000:])
    assert proc.returncode == 0, text[-12000:]

    gen = generator()
    # The types are the served document's too, not only the one the code makes.
    assert gen.render(served) == (PACKAGE / "src" / "types.gen.ts").read_text(), "regenerate the client's types"
    documented = {f"{method} {path}" for method, path, _ in gen.operations(served)}
    answered = {line.rsplit(" ", 1)[0] for line in routes_file.read_text().splitlines()
                if line.rsplit(" ", 1)[1].startswith("2")}
    assert documented <= answered, f"routes of the document the client's tests never had answered: " \
                                   f"{sorted(documented - answered)}"
    every = sum(len(ops) for ops in served["paths"].values())
    print(f"routes: {len(documented & answered)} of the {len(documented)} client routes answered 2xx; the document "
          f"has {every} operations (the rest are the provider callback, probes, metrics, the page and files)")
    print("figures:", json.dumps(_figures(figures_file)))


_HOP_BY_HOP = {"host", "connection", "content-length", "transfer-encoding", "content-encoding", "keep-alive"}


class AppServer:
    """The product's web server: its page (the bundle built from the package) and, on the same origin, the API
    passed through to vidjobs as a product's reverse proxy passes it (streams included, as they come). It counts
    the event streams the page holds open through it: a request the browser drops ends its handler at once."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.streams = 0
        self.url = ""

    async def forward(self, request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        streaming = request.path.endswith("/stream")
        self.streams += streaming
        try:
            async with self.stack.session.request(request.method, self.stack.url + request.rel_url.path_qs,
                                                  headers=headers, data=await request.read() or None) as upstream:
                resp = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
                await resp.prepare(request)
                with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                    async for chunk in upstream.content.iter_any():
                        await resp.write(chunk)
                return resp
        finally:
            self.streams -= streaming

    @contextlib.asynccontextmanager
    async def running(self) -> Any:
        page = PACKAGE / "build" / "page"

        async def index(_: web.Request) -> web.FileResponse:
            return web.FileResponse(page / "index.html")

        async def bundle(_: web.Request) -> web.FileResponse:
            return web.FileResponse(page / "app.js")

        app = web.Application()
        app.router.add_get("/", index)
        app.router.add_get("/app.js", bundle)
        app.router.add_route("*", "/v1/{tail:.*}", self.forward)
        runner = web.AppRunner(app, shutdown_timeout=1, handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            await runner.cleanup()


STAGE = "document.getElementById('job')?.dataset.stage"


@needs_node
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine")
async def test_a_page_built_with_the_hooks_shows_a_job_go_from_queued_to_ready(
        tmp_path: Path, database_url: str, nats_url: str, browser: Browser) -> None:  # noqa: F811
    await asyncio.to_thread(build)
    # One render at a time for this account, held by a job that never ends: the page's job waits its turn.
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(stack_settings(tmp_path, database_url, nats_url), key=key) as stack:
        blocker = await stack.create_job(params={"scenario": "hang"})
        await stack.wait_for_status(blocker["id"], "processing")
        async with stack.session.post(f"{stack.url}/v1/account/tokens", headers=stack.auth,
                                      json={"scopes": ["read", "create", "upload"], "ttl_s": 600}) as resp:
            token = (await resp.json())["token"]
        async with AppServer(stack).running() as app:
            await browser.open(f"{app.url}/#token={token}")
            await browser.js("document.getElementById('render').click()")
            assert await browser.until(STAGE, "the job to show") == "queued"
            place = await browser.until("document.getElementById('place')?.textContent", "its place in the queue")
            assert place == "Place in the queue: 1"
            assert await browser.until("document.getElementById('estimate')?.textContent", "its estimate")
            async with stack.session.post(f"{stack.url}/v1/jobs/{blocker['id']}/cancel", headers=stack.auth):
                pass
            await browser.until("document.getElementById('job').dataset.done === 'true'", "the job to end",
                                within=60)
            assert await browser.js(STAGE) == "ready"
            seen = await browser.js("window.seen")
            stages = ["queued", "submitted", "rendering", "downloading", "ready"]
            assert seen[0] == "queued" and seen[-1] == "ready", seen
            assert [stages.index(s) for s in seen] == sorted(stages.index(s) for s in seen), seen
            assert "/files/" in await browser.until("document.getElementById('video')?.src", "the video")
            assert app.streams == 0, "the stream closed when the job ended"

            # A browser reports an upload's progress (through XMLHttpRequest, with the same retries and errors).
            await browser.js("document.getElementById('upload').click()")
            uploaded = await browser.until("document.getElementById('uploaded')?.textContent", "the upload")
            assert uploaded.endswith("ready 300x300"), uploaded
            progress = await browser.js("window.progress")
            assert progress and progress[-1][0] == progress[-1][1] > 0, progress

            # Unmounted while its job still renders, the view closes its stream.
            await browser.js("const s = document.getElementById('scenario'); s.value = 'hang';"
                             "s.dispatchEvent(new Event('change', {bubbles: true}))")
            await browser.js("document.getElementById('render').click()")
            await browser.until(f"{STAGE} === 'rendering'", "the second job to render", within=30)
            assert app.streams == 1
            await browser.js("document.getElementById('hide').click()")

            async def closed() -> bool:
                return app.streams == 0

            await wait_until(closed, within=5, what="the stream to close on unmount")
        async with stack.session.get(f"{stack.url}/v1/jobs?status=processing", headers=stack.auth) as resp:
            for job in (await resp.json())["data"]:
                async with stack.session.post(f"{stack.url}/v1/jobs/{job['id']}/cancel", headers=stack.auth):
                    pass
