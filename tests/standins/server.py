"""What every stand-in shares: an aiohttp app on a free loopback port for the length of a block, the recorded
payloads and the scenario a prompt names, the answers that misbehave on purpose, and the tasks, client session
and deliveries of a stand-in that calls back (renders in flight, webhooks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import aiohttp
from aiohttp import web

from vidjobs.fakeprovider.background import BackgroundTasks
from vidjobs.fakeprovider.clips import ClipSpec, render_mp4


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """`app` listening on a free port of `host` until the block exits; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0).start()
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


PAYLOADS = Path(__file__).resolve().parent.parent / "payloads"
S = TypeVar("S")


@contextlib.asynccontextmanager
async def listening(standin: S, app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[S]:
    """`standin` served by `app` on a free port of `host` until the block exits, its `url` set meanwhile."""
    async with serving(app, host) as standin.url:  # type: ignore[attr-defined]
        yield standin


def standin_app(key: web.AppKey[S], standin: S, routes: list[web.RouteDef],
                door: Callable[..., Any]) -> web.Application:
    """The stand-in's app: its `door` middleware (the provider's key checks), its routes and, for a stand-in
    that calls back, `/_sink` and the lifetime of its tasks and session."""
    app = web.Application(middlewares=[web.middleware(door)])
    app[key] = standin
    app.add_routes(routes)
    if isinstance(standin, CallingStandin):
        app.router.add_post("/_sink", standin.sink)
        app.cleanup_ctx.append(standin.lifetime)
    return app


def payloads(provider: str) -> Callable[[str], dict[str, Any]]:
    """A reader of `provider`'s recorded payloads, each freshly parsed (the stand-in rewrites its copy)."""
    def payload(name: str) -> dict[str, Any]:
        return json.loads((PAYLOADS / provider / f"{name}.json").read_text())

    return payload


def scenario_in(prompt: str, word: str = "standin", default: str = "succeed") -> str:
    """The scenario a `<word>:<scenario>` in the prompt picks, else `default`."""
    found = re.search(rf"{word}:(\w+)", prompt)
    return found.group(1) if found else default


def answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def found(items: Mapping[str, S], request: web.Request, missing: dict[str, Any] | None = None) -> S:
    """The item the request's `{id}` names, or a 404 carrying the provider's own `missing` body."""
    item = items.get(request.match_info["id"])
    if item is None:
        raise web.HTTPNotFound(text=json.dumps(missing or {}), content_type="application/json")
    return item


async def json_body(request: web.Request, refusal: dict[str, Any]) -> dict[str, Any]:
    """The request's JSON body; one that is not JSON is answered 400 with the provider's own `refusal`."""
    try:
        return json.loads(await request.read())
    except ValueError:
        raise web.HTTPBadRequest(text=json.dumps(refusal), content_type="application/json") from None


R = TypeVar("R", bound="Render")


def render_routes(routes: web.RouteTableDef, key: web.AppKey[Any], path: str, video_path: str,
                  renders: Callable[[Any], Mapping[str, R]], ready: Callable[[R], bool], *,
                  missing: Callable[[], dict[str, Any]]) -> Callable[[web.Request], R]:
    """The routes a calling stand-in answers alike: `GET {path}/{id}`, one render as the provider shows it (the
    stand-in's `view`), and `GET {video_path}`, its video once `ready`. Returns the lookup of the render a
    request's `{id}` names (404 with the provider's `missing` body), for the routes that act on one."""

    def lookup(request: web.Request) -> R:
        return found(renders(request.app[key]), request, missing())

    async def get_render(request: web.Request) -> web.Response:
        return web.json_response(request.app[key].view(lookup(request)))

    async def get_video(request: web.Request) -> web.Response:
        render = renders(request.app[key]).get(request.match_info["id"])
        return await video(render.clip if render is not None and ready(render) else None)

    routes.get(f"{path}/{{id}}")(get_render)
    routes.get(video_path)(get_video)
    return lookup


async def video(clip: ClipSpec | None) -> web.Response:
    """The render as a real MP4, as the provider's CDN serves it; None: nothing to serve yet."""
    if clip is None:
        raise web.HTTPNotFound()
    return web.Response(body=await render_mp4(clip), content_type="video/mp4")


def bearer_door(prefix: str, key: Callable[[web.Request], str],
                refused: Callable[[], web.Response]) -> Callable[..., Any]:
    """The door of an API under `prefix` that wants `Authorization: Bearer <key>` on every call."""
    async def door(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        if request.path.startswith(prefix) and request.headers.get("Authorization") != f"Bearer {key(request)}":
            return refused()
        return await handler(request)

    return door


def now() -> str:
    """The time as providers write it: ISO 8601 in UTC with a `Z`."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass(kw_only=True)
class Render:
    """One render a calling stand-in works on in the background; a provider's record adds its own fields."""

    id: str
    scenario: Any  # the stand-in's Scenario
    clip: ClipSpec  # what its video shows
    created_at: str = field(default_factory=now)
    task: asyncio.Task | None = None


def truncated(body: dict[str, Any], status: int) -> web.Response:
    """A JSON answer cut off half way: what a provider's broken proxy sends."""
    whole = json.dumps(body).encode()
    return web.Response(body=whole[: len(whole) // 2], status=status, content_type="application/json")


def not_json() -> web.Response:
    """A 200 whose body is an HTML page, not the provider's JSON."""
    return web.Response(status=200, text="<html><body>upstream hiccup</body></html>", content_type="text/html")


@dataclass
class Delivery:
    """One callback POST a stand-in made, and how the receiver answered (a status or an error)."""

    url: str
    headers: dict[str, str]
    body: bytes
    outcome: int | str


@dataclass
class Received:
    """One POST to a stand-in's `/_sink`."""

    headers: dict[str, str]
    body: bytes


class CallingStandin(BackgroundTasks):
    """A stand-in that works in the background and calls out: its tasks and session live as long as its app
    (`app.cleanup_ctx.append(standin.lifetime)`), and `/_sink` keeps what is POSTed to it."""

    session_timeout_s = 10.0

    def __init__(self) -> None:
        self.url = ""  # set once listening
        self.received: list[Received] = []
        self.deliveries: list[Delivery] = []
        self.session: aiohttp.ClientSession | None = None
        super().__init__()

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.session_timeout_s)) as session:
            self.session = session
            yield
            await self.close()

    async def deliver(self, url: str, body: bytes, *, attempts: int, headers: Callable[[], dict[str, str]],
                      taken: Callable[[int | str], bool], pause: Callable[[int], float]) -> None:
        """POST `body` to `url` until the receiver's answer is `taken` or `attempts` are spent, waiting
        `pause(attempt)` between tries; each try is kept in `deliveries`."""
        assert self.session is not None
        for attempt in range(attempts):
            sent = {"Content-Type": "application/json", **headers()}
            try:
                async with self.session.post(url, data=body, headers=sent) as resp:
                    outcome: int | str = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = repr(exc)
            self.deliveries.append(Delivery(url, sent, body, outcome))
            if taken(outcome) or attempt == attempts - 1:
                return
            await asyncio.sleep(pause(attempt))

    async def worked(self, render: Render, step_s: float) -> bool:
        """A render's working step, as long as `step_s`: False at once for one whose scenario is `hang` (it stays
        running for good), else True when the step is over."""
        if render.scenario == "hang":
            return False
        await asyncio.sleep(step_s)
        return True

    async def sink(self, request: web.Request) -> web.Response:
        self.received.append(Received(dict(request.headers), await request.read()))
        return web.json_response({"received": True})


@dataclass
class PolledStandin:
    """A stand-in for a provider that sends no callbacks: each status poll walks the next step of a script of
    recorded states, and a few scenarios misbehave at the door (refused submits) or on a poll."""

    # Door scenario -> (status, recorded payload, headers) a submit is answered with instead of being accepted;
    # `rate_limit` only for the first `refusals` submits of a prompt.
    door: ClassVar[dict[str, tuple[int, str, dict[str, str] | None]]]
    api_key: str
    refusals: int = 2
    slow_s: float = 5.0
    url: str = ""
    submissions: list[dict[str, Any]] = field(default_factory=list)  # every accepted body, in order
    refused: Counter[str] = field(default_factory=Counter)  # 429s answered, per prompt
    downloads: int = 0

    def at_the_door(self, scenario: str, prompt: str) -> tuple[int, str, dict[str, str] | None] | None:
        if scenario == "rate_limit":
            if self.refused[prompt] >= self.refusals:
                return None
            self.refused[prompt] += 1
        return self.door.get(scenario)

    async def misbehaving(self, scenario: str) -> web.Response | None:
        """The answer a poll gets in place of the task's state, if its scenario gives one (a slow poll only waits)."""
        if scenario == "garbled":
            return not_json()
        if scenario == "slow":
            await asyncio.sleep(self.slow_s)
        return None


def step(scripts: dict[str, list[str]], scenario: str, polls: int) -> str:
    """The recorded state a poll answers: the script's next, its last repeated once it is walked."""
    script = scripts.get(scenario, scripts["succeed"])
    return script[min(polls, len(script) - 1)]
