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
import secrets
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.standins import server
from tests.standins.server import CallingStandin, Render, bearer_door, listening, now, payloads, scenario_in
from vidjobs.common import signatures
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4

RETRY_AFTER_S = 1


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


payload = payloads("replicate")  # as Replicate's documentation shows them


@dataclass(kw_only=True)
class Prediction(Render):
    model: str
    input: dict[str, Any]
    webhook: str | None
    events: tuple[str, ...]
    status: str = "starting"
    started_at: str | None = None
    completed_at: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in _TERMINAL


class ReplicateStandin(CallingStandin):
    def __init__(self, *, api_token: str, webhook_secret: str, step_s: float = 0.2, webhook_attempts: int = 3):
        super().__init__()
        signatures.decode_secret(webhook_secret)
        self.api_token = api_token
        self.webhook_secret = webhook_secret
        self.step_s = step_s  # each state lasts this long
        self.webhook_attempts = webhook_attempts
        self.predictions: dict[str, Prediction] = {}
        self.creates: list[dict[str, Any]] = []  # every create body, as sent
        self.creates_by_prompt: Counter[str] = Counter()

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
            id=pid, model=model, input=given, scenario=Scenario(scenario_in(str(given.get("prompt", "")))),
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
        pred.status, pred.started_at = "processing", now()
        self.notify(pred, "logs")
        if not await self.worked(pred, self.step_s):
            return
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
        pred.status, pred.completed_at = status, now()
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
        # Signed afresh for each try under one message id; retried with backoff on 429, 5xx and no answer.
        msg_id = signatures.new_message_id()
        delivery = self.deliver(
            pred.webhook, body, attempts=self.webhook_attempts,
            headers=lambda: signatures.signed_headers(self.webhook_secret, body, msg_id=msg_id),
            taken=lambda outcome: isinstance(outcome, int) and outcome < 500 and outcome != 429,
            pause=lambda attempt: 0.2 * 2**attempt)
        self.spawn(delivery, f"webhook-{pred.id}-{event}")


# --- HTTP ----------------------------------------------------------------------------------------------

ROUTES = web.RouteTableDef()
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


@ROUTES.post("/v1/models/{owner}/{name}/predictions")
async def create_prediction(request: web.Request) -> web.Response:
    standin = request.app[STANDIN]
    body = await server.json_body(request, {"detail": "The request body is not valid JSON.", "status": 400})
    standin.creates.append(body)
    prompt = str((body.get("input") or {}).get("prompt", ""))
    standin.creates_by_prompt[prompt] += 1
    scenario = Scenario(scenario_in(prompt))
    if (refused := _refusal(standin, scenario, prompt)) is not None:
        return refused
    model = f"{request.match_info['owner']}/{request.match_info['name']}"
    if scenario is Scenario.MALFORMED:
        return server.truncated(payload("prediction_starting"), 201)
    pred = standin.create(model, body)
    return web.json_response(standin.view(pred), status=201)


_prediction = server.render_routes(ROUTES, STANDIN, "/v1/predictions", "/files/{id}/output.mp4",
                                   lambda standin: standin.predictions, lambda pred: pred.status == "succeeded",
                                   missing=lambda: payload("error_404_not_found"))


@ROUTES.post("/v1/predictions/{id}/cancel")
async def cancel_prediction(request: web.Request) -> web.Response:
    standin, pred = request.app[STANDIN], _prediction(request)
    standin.cancel(pred)
    return web.json_response(standin.view(pred))


require_token = bearer_door("/v1/", lambda request: request.app[STANDIN].api_token,
                            lambda: _problem("error_401_unauthenticated", 401))


def running_replicate_standin(*, api_token: str, webhook_secret: str, host: str = "127.0.0.1",
                              **options: Any) -> contextlib.AbstractAsyncContextManager[ReplicateStandin]:
    """A Replicate stand-in listening on a free port of `host` until the block exits."""
    standin = ReplicateStandin(api_token=api_token, webhook_secret=webhook_secret, **options)
    return listening(standin, server.standin_app(STANDIN, standin, ROUTES, require_token), host)
