"""A stand-in for Runway's API on loopback, replaying the recorded payloads in tests/payloads/runway.

It speaks the routes the adapter uses (`POST /v1/text_to_video`, `POST /v1/image_to_video`,
`GET /v1/tasks/{id}`, `DELETE /v1/tasks/{id}`), checks the API key and version header like Runway, and serves
each task's output as a real MP4 at `/outputs/{id}.mp4` (signed by URL at Runway, so it asks for no key).

A `scenario:<name>` word in the prompt picks what happens. Most scenarios are a script: the recorded task
states the task walks through, one per status poll, the last repeated. The rest misbehave at the door:
| scenario | behaviour |
|---|---|
| `succeed` (default) | PENDING, THROTTLED, RUNNING 42 % (two polls), SUCCEEDED |
| `throttled` | THROTTLED for three polls, then RUNNING and SUCCEEDED |
| `safety`, `safety_output`, `bad_output`, `asset_invalid` | FAILED with that kind of failureCode |
| `preprocessing_safety`, `preprocessing_internal` | FAILED with that kind of failureCode |
| `hang` | RUNNING for ever |
| `malformed` | a task body that breaks Runway's schema |
| `rate_limit` | 429 with Retry-After to the first `refusals` submits of that prompt, then `succeed` |
| `unavailable` | 503 to every submit |
| `invalid` | 400 "Validation of body failed" to every submit |
| `garbled` | status answers that are not JSON |
| `slow` | status answers after `slow_s` seconds |
| `lost` | status answers 404: Runway forgot the task |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.standins.server import serving
from vidjobs.providers.fake.render import ClipSpec, clip_size, render_mp4

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "runway"
API_VERSION = "2024-11-06"
SCENARIO = re.compile(r"scenario:([a-z_]+)")

SCRIPTS: dict[str, list[str]] = {
    "succeed": ["task_pending", "task_throttled", "task_running", "task_running", "task_succeeded"],
    "throttled": ["task_throttled", "task_throttled", "task_throttled", "task_running", "task_succeeded"],
    "safety": ["task_pending", "task_failed_safety"],
    "safety_output": ["task_running", "task_failed_safety_output"],
    "bad_output": ["task_running", "task_failed_internal"],
    "asset_invalid": ["task_failed_asset_invalid"],
    "preprocessing_safety": ["task_failed_preprocessing_safety"],
    "preprocessing_internal": ["task_failed_preprocessing_internal"],
    "hang": ["task_running"],
    "malformed": ["task_malformed"],
}
DOOR_SCENARIOS = ("rate_limit", "unavailable", "invalid", "garbled", "slow", "lost")


def payload(name: str) -> dict[str, Any]:
    """One recorded payload, freshly parsed."""
    return json.loads((PAYLOADS / f"{name}.json").read_text())


@dataclass
class Task:
    id: str
    scenario: str
    body: dict[str, Any]
    polls: int = 0
    canceled: bool = False


@dataclass
class RunwayStandin:
    api_key: str
    refusals: int = 2  # rate_limit: 429s before a prompt is accepted
    slow_s: float = 5.0
    url: str = ""
    tasks: dict[str, Task] = field(default_factory=dict)
    submissions: list[dict[str, Any]] = field(default_factory=list)  # every accepted body, in order
    routes: list[str] = field(default_factory=list)  # the path each accepted body came to
    refused: Counter[str] = field(default_factory=Counter)  # 429s answered, per prompt
    deletes: list[str] = field(default_factory=list)
    downloads: int = 0

    def submitted(self, prompt: str) -> list[dict[str, Any]]:
        return [body for body in self.submissions if body.get("promptText") == prompt]


def scenario_of(prompt: str) -> str:
    found = SCENARIO.search(prompt)
    return found.group(1) if found else "succeed"


STANDIN = web.AppKey("standin", RunwayStandin)


def _answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def runway_checks(request: web.Request, handler: Any) -> web.StreamResponse:
    """Runway's door: a Bearer API key and the API version header on every API route."""
    if request.path.startswith("/v1/"):
        if request.headers.get("Authorization") != f"Bearer {request.app[STANDIN].api_key}":
            return _answer(401, payload("error_unauthorized"))
        if request.headers.get("X-Runway-Version") != API_VERSION:
            return _answer(400, {"error": "The X-Runway-Version header is missing or names an unknown version."})
    return await handler(request)


async def create_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    body = await request.json()
    scenario = scenario_of(str(body.get("promptText", "")))
    if scenario == "unavailable":
        return _answer(503, payload("error_unavailable"))
    if scenario == "invalid":
        return _answer(400, payload("error_validation"))
    if scenario == "rate_limit" and standin.refused[body["promptText"]] < standin.refusals:
        standin.refused[body["promptText"]] += 1
        return _answer(429, payload("error_rate_limit"), headers={"Retry-After": "1"})
    task = Task(id=str(uuid.uuid4()), scenario=scenario, body=body)
    standin.tasks[task.id] = task
    standin.submissions.append(body)
    standin.routes.append(request.path)
    return _answer(200, {**payload("create_task"), "id": task.id})


async def get_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    task = standin.tasks.get(request.match_info["task_id"])
    if task is None or task.scenario == "lost":
        return _answer(404, payload("error_not_found"))
    if task.scenario == "garbled":
        return web.Response(status=200, text="<html><body>upstream hiccup</body></html>", content_type="text/html")
    if task.scenario == "slow":
        await asyncio.sleep(standin.slow_s)
    return _answer(200, _task_state(standin, task))


def _task_state(standin: RunwayStandin, task: Task) -> dict[str, Any]:
    if task.canceled:
        name = "task_cancelled"
    else:
        script = SCRIPTS.get(task.scenario, SCRIPTS["succeed"])
        name = script[min(task.polls, len(script) - 1)]
        task.polls += 1
    state = payload(name)
    state["id"] = task.id
    if "output" in state:
        state["output"] = [f"{standin.url}/outputs/{task.id}.mp4"]
    return state


async def delete_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    task = standin.tasks.get(request.match_info["task_id"])
    if task is None:
        return _answer(404, payload("error_not_found"))
    standin.deletes.append(task.id)
    task.canceled = True
    return web.Response(status=204)


async def get_output(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    task = standin.tasks.get(request.match_info["task_id"])
    if task is None:
        raise web.HTTPNotFound()
    standin.downloads += 1
    data = await render_mp4(_clip(task.body))
    return web.Response(body=data, content_type="video/mp4")


def _clip(body: dict[str, Any]) -> ClipSpec:
    width, height = (int(side) for side in str(body.get("ratio", "1280:720")).split(":"))
    aspect = "16:9" if width > height else "9:16" if width < height else "1:1"
    return ClipSpec(*clip_size(aspect), duration_s=float(body.get("duration", 5)), seed=int(body.get("seed", 7)))


def create_app(standin: RunwayStandin) -> web.Application:
    app = web.Application(middlewares=[runway_checks])
    app[STANDIN] = standin
    app.router.add_post("/v1/text_to_video", create_task)
    app.router.add_post("/v1/image_to_video", create_task)
    app.router.add_get("/v1/tasks/{task_id}", get_task)
    app.router.add_delete("/v1/tasks/{task_id}", delete_task)
    app.router.add_get("/outputs/{task_id}.mp4", get_output)
    return app


@contextlib.asynccontextmanager
async def running_runway(api_key: str, **options: Any) -> AsyncIterator[RunwayStandin]:
    """A Runway stand-in on a free loopback port until the block exits; its `url` is the base URL."""
    standin = RunwayStandin(api_key=api_key, **options)
    async with serving(create_app(standin)) as standin.url:
        yield standin
