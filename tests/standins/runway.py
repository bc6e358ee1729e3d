"""A stand-in for Runway's API on loopback, replaying the recorded payloads in tests/payloads/runway.

It speaks the routes the adapter uses (`POST /v1/text_to_video`, `POST /v1/image_to_video`,
`GET /v1/tasks/{id}`, `DELETE /v1/tasks/{id}`), checks the API key and version header like Runway, and serves
each task's output as a real MP4 at `/outputs/{id}.mp4` (signed by URL at Runway, so it asks for no key).

A `scenario:<name>` word in the prompt picks what happens. Most scenarios are a script: the recorded task
states the task walks through, one per status poll, the last repeated, each with its recorded credits
(`estimatedCost` while under way, the billed `cost` once ended). The rest misbehave at the door:
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

import contextlib
import functools
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from tests.standins.server import PAYLOADS as ALL_PAYLOADS
from tests.standins.server import PolledStandin, answer, listening, payloads, scenario_in, standin_app, step
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4

PAYLOADS = ALL_PAYLOADS / "runway"
API_VERSION = "2024-11-06"

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
payload = payloads("runway")


@dataclass
class Task:
    id: str
    scenario: str
    body: dict[str, Any]
    polls: int = 0
    canceled: bool = False


@dataclass
class RunwayStandin(PolledStandin):
    door: ClassVar = {"unavailable": (503, "error_unavailable", None), "invalid": (400, "error_validation", None),
                      "rate_limit": (429, "error_rate_limit", {"Retry-After": "1"})}
    tasks: dict[str, Task] = field(default_factory=dict)
    routes: list[str] = field(default_factory=list)  # the path each accepted body came to
    deletes: list[str] = field(default_factory=list)

    def submitted(self, prompt: str) -> list[dict[str, Any]]:
        return [body for body in self.submissions if body.get("promptText") == prompt]


scenario_of = functools.partial(scenario_in, word="scenario")


ROUTES = web.RouteTableDef()
STANDIN = web.AppKey("standin", RunwayStandin)


async def runway_checks(request: web.Request, handler: Any) -> web.StreamResponse:
    """Runway's door: a Bearer API key and the API version header on every API route."""
    if request.path.startswith("/v1/"):
        if request.headers.get("Authorization") != f"Bearer {request.app[STANDIN].api_key}":
            return answer(401, payload("error_unauthorized"))
        if request.headers.get("X-Runway-Version") != API_VERSION:
            return answer(400, {"error": "The X-Runway-Version header is missing or names an unknown version."})
    return await handler(request)


@ROUTES.post("/v1/text_to_video")
@ROUTES.post("/v1/image_to_video")
async def create_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    body = await request.json()
    scenario = scenario_of(str(body.get("promptText", "")))
    if refused := standin.at_the_door(scenario, str(body.get("promptText", ""))):
        status, name, headers = refused
        return answer(status, payload(name), headers)
    task = Task(id=str(uuid.uuid4()), scenario=scenario, body=body)
    standin.tasks[task.id] = task
    standin.submissions.append(body)
    standin.routes.append(request.path)
    return answer(200, {**payload("create_task"), "id": task.id})


@ROUTES.get("/v1/tasks/{task_id}")
async def get_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    task = standin.tasks.get(request.match_info["task_id"])
    if task is None or task.scenario == "lost":
        return answer(404, payload("error_not_found"))
    if (misbehaved := await standin.misbehaving(task.scenario)) is not None:
        return misbehaved
    return answer(200, _task_state(standin, task))


def _task_state(standin: RunwayStandin, task: Task) -> dict[str, Any]:
    if task.canceled:
        name = "task_cancelled"
    else:
        name = step(SCRIPTS, task.scenario, task.polls)
        task.polls += 1
    state = payload(name)
    state["id"] = task.id
    if "output" in state:
        state["output"] = [f"{standin.url}/outputs/{task.id}.mp4"]
    return state


@ROUTES.delete("/v1/tasks/{task_id}")
async def delete_task(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    task = standin.tasks.get(request.match_info["task_id"])
    if task is None:
        return answer(404, payload("error_not_found"))
    standin.deletes.append(task.id)
    task.canceled = True
    return web.Response(status=204)


@ROUTES.get("/outputs/{task_id}.mp4")
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




def running_runway(api_key: str, **options: Any) -> contextlib.AbstractAsyncContextManager[RunwayStandin]:
    """A Runway stand-in on a free loopback port until the block exits; its `url` is the base URL."""
    standin = RunwayStandin(api_key=api_key, **options)
    return listening(standin, standin_app(STANDIN, standin, ROUTES, runway_checks))
