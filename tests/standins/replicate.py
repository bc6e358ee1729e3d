"""A stand-in for Replicate's predictions API on loopback, replaying the recorded payloads in
`tests/payloads/replicate` with ids, inputs, URLs and timestamps rewritten for each prediction.

Routes, as Replicate has them (JSON; errors are problem details):
  POST /v1/models/{owner}/{name}/predictions   create (201); `webhook` and `webhook_events_filter` honoured
  GET  /v1/predictions/{id}                    one prediction
  POST /v1/predictions/{id}/cancel             cancel it unless it has finished
  GET  /files/{id}/output.mp4                  the render, a real MP4 (as replicate.delivery serves it)
  POST /_sink                                  keeps whatever is POSTed: a webhook receiver for unit tests

Every /v1 call needs `Authorization: Bearer <api_token>`. Webhooks are signed with the configured `whsec_`
secret (Standard Webhooks), and retried with the same `webhook-id` on 429, 5xx and connection errors.

A `standin:<scenario>` word in the prompt picks the behaviour (params are checked against the model's real
inputs, so they cannot carry it):
  succeed (default)  starting, processing, succeeded; the output a URL
  output_list        succeeded with the output a list of URLs
  sensitive          failed by the safety check (E005)
  oom                failed out of memory (E1001)
  canceled           processing, then canceled
  aborted            aborted before it started
  rate_limit         create answered 429 with `Retry-After: 1`
  rate_limit_once    the first create for this prompt answered like rate_limit; later ones accepted
  throttled          create answered 429 with no Retry-After, the wait only in the body
  unavailable        create answered 503
  invalid            create answered 422 (input validation failed)
  no_credit          create answered 402
  malformed          create answered 201 with a truncated body
  no_webhook         renders but sends no webhook
  hang               stays processing
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import json
import re
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.standins.server import CallingStandin, serving
from vidjobs.providers import webhooks
from vidjobs.providers.fake.render import ClipSpec, clip_size, render_mp4

PAYLOADS = Path(__file__).resolve().parent.parent / "payloads" / "replicate"
RETRY_AFTER_S = 1
_SCENARIO_WORD = re.compile(r"standin:(\w+)")


class Scenario(enum.StrEnum):
    SUCCEED = "succeed"
    OUTPUT_LIST = "output_list"
    SENSITIVE = "sensitive"
    OOM = "oom"
    CANCELED = "canceled"
    ABORTED = "aborted"
    RATE_LIMIT = "rate_limit"
    RATE_LIMIT_ONCE = "rate_limit_once"
    THROTTLED = "throttled"
    UNAVAILABLE = "unavailable"
    INVALID = "invalid"
    NO_CREDIT = "no_credit"
    MALFORMED = "malformed"
    NO_WEBHOOK = "no_webhook"
    HANG = "hang"


# The scenarios whose render fails, and the recorded payload each failure is replayed from.
_FAILED = {Scenario.SENSITIVE: "prediction_failed_sensitive", Scenario.OOM: "prediction_failed_oom"}
_TERMINAL = frozenset({"succeeded", "failed", "canceled", "aborted"})


def payload(name: str) -> dict[str, Any]:
    """One recorded payload, as Replicate's documentation shows it."""
    return json.loads((PAYLOADS / f"{name}.json").read_text())


def scenario_of(prompt: str) -> Scenario:
    match = _SCENARIO_WORD.search(prompt)
    return Scenario(match.group(1)) if match else Scenario.SUCCEED


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Prediction:
    id: str
    model: str
    input: dict[str, Any]
    scenario: Scenario
    webhook: str | None
    events: tuple[str, ...]
    clip: ClipSpec
    status: str = "starting"
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    completed_at: str | None = None
    task: asyncio.Task | None = None

    @property
    def finished(self) -> bool:
        return self.status in _TERMINAL


@dataclass
class Delivery:
    """One webhook POST the stand-in made, and how the receiver answered (a status or an error)."""

    headers: dict[str, str]
    body: bytes
    outcome: int | str


class ReplicateStandin(CallingStandin):
    def __init__(self, *, api_token: str, webhook_secret: str, step_s: float = 0.2, webhook_attempts: int = 3):
        super().__init__()
        webhooks.decode_secret(webhook_secret)
        self.api_token = api_token
        self.webhook_secret = webhook_secret
        self.step_s = step_s  # each state lasts this long
        self.webhook_attempts = webhook_attempts
        self.predictions: dict[str, Prediction] = {}
        self.creates: list[dict[str, Any]] = []  # every create body, as sent
        self.creates_by_prompt: Counter[str] = Counter()
        self.deliveries: list[Delivery] = []

    # views

    def view(self, pred: Prediction) -> dict[str, Any]:
        """The prediction as Replicate shows it: the recorded payload for its state, rewritten for it."""
        body = payload(self._template(pred))
        body.update(id=pred.id, model=pred.model, input=pred.input, created_at=pred.created_at,
                    started_at=pred.started_at, completed_at=pred.completed_at, urls={
                        "cancel": f"{self.url}/v1/predictions/{pred.id}/cancel",
                        "get": f"{self.url}/v1/predictions/{pred.id}",
                        "web": f"{self.url}/p/{pred.id}",
                    })
        if pred.status == "succeeded":
            output = f"{self.url}/files/{pred.id}/output.mp4"
            body["output"] = [output] if isinstance(body["output"], list) else output
        return body

    def _template(self, pred: Prediction) -> str:
        if pred.status == "succeeded" and pred.scenario is Scenario.OUTPUT_LIST:
            return "prediction_succeeded_list"
        if pred.status == "failed":
            return _FAILED[pred.scenario]
        return f"prediction_{pred.status}"

    # lifecycle

    def create(self, model: str, body: dict[str, Any]) -> Prediction:
        given = body.get("input") or {}
        pid = base64.b32encode(secrets.token_bytes(20)).decode().lower()[:26]  # Replicate's id shape
        width, height = clip_size(given.get("aspect_ratio", "16:9"))
        clip = ClipSpec(width, height, float(given.get("duration", 6)), secrets.randbelow(2**31))
        pred = Prediction(
            id=pid, model=model, input=given, scenario=scenario_of(str(given.get("prompt", ""))),
            webhook=body.get("webhook"), clip=clip,
            events=tuple(body.get("webhook_events_filter") or ("start", "output", "logs", "completed")),
        )
        self.predictions[pid] = pred
        pred.task = self.spawn(self._run(pred), f"prediction-{pid}")
        return pred

    async def _run(self, pred: Prediction) -> None:
        await asyncio.sleep(0.05)  # the create answer goes out first, as at Replicate
        self.notify(pred, "start")
        await asyncio.sleep(self.step_s)
        if pred.scenario is Scenario.ABORTED:
            self._finish(pred, "aborted")
            return
        pred.status, pred.started_at = "processing", _now()
        self.notify(pred, "logs")
        if pred.scenario is Scenario.HANG:
            return
        await asyncio.sleep(self.step_s)
        if pred.scenario in _FAILED:
            self._finish(pred, "failed")
        elif pred.scenario is Scenario.CANCELED:
            self._finish(pred, "canceled")
        else:
            await render_mp4(pred.clip)  # ready before success is reported, so the output serves at once
            self._finish(pred, "succeeded")

    def _finish(self, pred: Prediction, status: str) -> None:
        if pred.finished:
            return
        pred.status, pred.completed_at = status, _now()
        self.notify(pred, "completed")

    def cancel(self, pred: Prediction) -> None:
        if pred.finished:
            return
        if pred.task is not None:
            pred.task.cancel()
        self._finish(pred, "canceled")

    # webhooks

    def notify(self, pred: Prediction, event: str) -> None:
        if pred.webhook is None or event not in pred.events or pred.scenario is Scenario.NO_WEBHOOK:
            return
        body = json.dumps(self.view(pred)).encode()
        self.spawn(self._deliver(pred.webhook, body), f"webhook-{pred.id}-{event}")

    async def _deliver(self, url: str, body: bytes) -> None:
        assert self.session is not None
        msg_id = webhooks.new_message_id()
        for attempt in range(self.webhook_attempts):
            headers = {"Content-Type": "application/json",
                       **webhooks.signed_headers(self.webhook_secret, body, msg_id=msg_id)}
            try:
                async with self.session.post(url, data=body, headers=headers) as resp:
                    outcome: int | str = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = repr(exc)
            self.deliveries.append(Delivery(headers, body, outcome))
            if isinstance(outcome, int) and (outcome < 500 and outcome != 429):
                return
            await asyncio.sleep(0.2 * 2**attempt)


# --- HTTP ----------------------------------------------------------------------------------------------

STANDIN = web.AppKey("standin", ReplicateStandin)


def _problem(name: str, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(payload(name), status=status, headers=headers,
                             content_type="application/problem+json")


def _refusal(standin: ReplicateStandin, scenario: Scenario, prompt: str) -> web.Response | None:
    """The error answer a scenario gives to a create, if it gives one."""
    first = standin.creates_by_prompt[prompt] == 1
    if scenario is Scenario.RATE_LIMIT or (scenario is Scenario.RATE_LIMIT_ONCE and first):
        return _problem("error_429_throttled", 429, {"Retry-After": str(RETRY_AFTER_S)})
    refusals = {
        Scenario.THROTTLED: ("error_429_resets", 429), Scenario.UNAVAILABLE: ("error_503_unavailable", 503),
        Scenario.INVALID: ("error_422_validation", 422), Scenario.NO_CREDIT: ("error_402_insufficient_credit", 402),
    }
    if scenario in refusals:
        return _problem(*refusals[scenario])
    return None


async def create_prediction(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    try:
        body = json.loads(await request.read())
    except ValueError:
        return web.json_response({"detail": "The request body is not valid JSON.", "status": 400}, status=400)
    standin.creates.append(body)
    prompt = str((body.get("input") or {}).get("prompt", ""))
    standin.creates_by_prompt[prompt] += 1
    scenario = scenario_of(prompt)
    if (refused := _refusal(standin, scenario, prompt)) is not None:
        return refused
    model = f"{request.match_info['owner']}/{request.match_info['name']}"
    if scenario is Scenario.MALFORMED:
        whole = json.dumps(payload("prediction_starting")).encode()
        return web.Response(body=whole[: len(whole) // 2], status=201, content_type="application/json")
    pred = standin.create(model, body)
    return web.json_response(standin.view(pred), status=201)


def _prediction(request: web.Request) -> Prediction:
    pred = request.app[STANDIN].predictions.get(request.match_info["id"])
    if pred is None:
        raise web.HTTPNotFound(text=json.dumps(payload("error_404_not_found")), content_type="application/json")
    return pred


async def get_prediction(request: web.Request) -> web.Response:
    return web.json_response(request.app[STANDIN].view(_prediction(request)))


async def cancel_prediction(request: web.Request) -> web.Response:
    standin, pred = request.app[STANDIN], _prediction(request)
    standin.cancel(pred)
    return web.json_response(standin.view(pred))


async def get_output(request: web.Request) -> web.Response:
    pred = request.app[STANDIN].predictions.get(request.match_info["id"])
    if pred is None or pred.status != "succeeded":
        raise web.HTTPNotFound()
    return web.Response(body=await render_mp4(pred.clip), content_type="video/mp4")


@web.middleware
async def require_token(request: web.Request, handler) -> web.StreamResponse:
    if request.path.startswith("/v1/"):
        if request.headers.get("Authorization") != f"Bearer {request.app[STANDIN].api_token}":
            return _problem("error_401_unauthenticated", 401)
    return await handler(request)


def create_app(standin: ReplicateStandin) -> web.Application:
    app = web.Application(middlewares=[require_token])
    app[STANDIN] = standin
    app.router.add_post("/v1/models/{owner}/{name}/predictions", create_prediction)
    app.router.add_get("/v1/predictions/{id}", get_prediction)
    app.router.add_post("/v1/predictions/{id}/cancel", cancel_prediction)
    app.router.add_get("/files/{id}/output.mp4", get_output)
    app.router.add_post("/_sink", standin.sink)
    app.cleanup_ctx.append(standin.lifetime)
    return app


@contextlib.asynccontextmanager
async def running_replicate_standin(*, api_token: str, webhook_secret: str, host: str = "127.0.0.1",
                                    **options: Any) -> AsyncIterator[ReplicateStandin]:
    """A Replicate stand-in listening on a free port of `host` until the block exits."""
    standin = ReplicateStandin(api_token=api_token, webhook_secret=webhook_secret, **options)
    async with serving(create_app(standin), host) as standin.url:
        yield standin
