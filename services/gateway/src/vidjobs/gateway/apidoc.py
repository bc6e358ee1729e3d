"""docs/API.md, the API reference, written from the same OpenAPI document `/openapi.json` serves, so the page
cannot drift from what is served (a test compares them).

    python -m vidjobs.gateway.apidoc > docs/API.md
"""

from __future__ import annotations

import sys
from typing import Any

from vidjobs.common.settings import Settings
from vidjobs.gateway.app import route_table
from vidjobs.gateway.errortable import error_table
from vidjobs.gateway.openapi import document

_INTRO = """# API reference

Generated from the OpenAPI document the gateway serves at `GET /openapi.json` (`python -m
vidjobs.gateway.apidoc > docs/API.md`); the document is the authority. Every `/v1` route but the provider
callback route takes a credential as `Authorization: Bearer <credential>` (see Credentials; a product wiring
vidjobs behind its own users starts at docs/INTEGRATING.md). Every answer carries `X-Request-Id`; every answer
to a request made with a key carries `RateLimit` and `RateLimit-Policy`. Errors are
`{"error": {"code", "message", "retryable", "request_id"}}` (the `ErrorBody` schema lists every code). A
request that meets a part of the service not answering (its database stalled or restarting) is answered
`503` `unavailable` with `Retry-After` within a few seconds (`VIDJOBS_DB_CALL_TIMEOUT_S`) rather than held;
a create answered so may or may not have been made, and sent again with its `Idempotency-Key` is made once.
The settings named here are in docs/SETTINGS.md; the fake provider's models and `params` (`scenario`, ...) in
docs/FAKE_PROVIDER.md; how the parts fit in docs/ARCHITECTURE.md.

## When a waiting job starts

A job waiting for a render slot (`status` `pending`) carries `estimate` (a `QueueEstimate`; null for any
other status): `jobs_ahead`, the jobs of every account likely to start before it at its provider, and
`jobs_ahead_p90`, as many as may; `start_p50`-`start_p90` and `ready_p50`-`ready_p90`, when it is likely to
start and be ready, from the typical case to a late one; and `note`, in words, what the times rest on. They
are made from what this deployment measured, not from a provider's published figures: of the model's jobs
completed in the last 24 hours (at most the last 200, by default), how long each held its provider slot and
how long it took from start to ready, p50 and p90. The provider hands its slots out round robin across
accounts, each account's oldest job first, so a job k-th in its account's queue at its provider waits for
its own k-1 and, of every other account with n jobs waiting there, min(n, k-1) to min(n, k); it starts when
that many of the provider's slots (`VIDJOBS_PROVIDER_LIMITS` concurrency, and its rate) and of its account's
own (`concurrent_jobs`) have come free, and is ready one render later. Times are rounded outwards: to the
second within a minute, 5 s within ten, a minute within the hour, then 5 and 15 minutes. With fewer than 5
renders measured (by default), while the platform pauses submissions, or while the provider is unavailable,
the times are null, `unavailable` says which (`too_few_renders`, `submissions_paused`,
`provider_unavailable`) and `note` says it in words. The job's event stream sends the job again when its
estimate moves by more than that rounding or a job ahead of it leaves; what the estimates read is shared by
every request and stream of a gateway process and read again every few seconds (`VIDJOBS_ESTIMATE_*`
settings, docs/SETTINGS.md).

## When a rendering job is ready

A job at its provider (`status` `submitted` or `processing`) carries `ready` (a `ReadyEstimate`; null for any
other status): `ready_p50`-`ready_p90`, when it is likely to be ready, from the typical case to a late one,
and `note`, in words, what the times rest on. They are its start (`started_at`) plus the p50 and p90 of how
long the model's renders measured here took from start to ready (the renders a waiting job's estimate reads),
rounded as those times are. With fewer than 5 renders measured (by default) the times are null and
`unavailable` is `too_few_renders`; once the late end has passed they are null and `unavailable` is
`overdue`: the render is taking longer than nine in ten of those measured, and nothing measured says when it
ends. Either way `deadline_at` is when the render is stopped. A provider's own progress figure (`progress`) is
shown as reported and never turned into a time. The job's event stream sends the job again when its range
moves by more than that rounding or its times come or go.

## Retries

A transient failure sends a job round again as a new attempt: `attempt` counts them (a rate limit waits
without spending one), and `retry` says what ended the last try (`code`, `message`; while `retrying`, the
attempt it shows) and the most attempts it may have (`max_attempts`), null until it is first retried. Its
`status` says where the new attempt is (`retrying` through the backoff, then `pending`, `submitted`, ...),
but its `stage` never goes back: a job retried while rendering still shows `rendering` while it queues
again. Its trail's `stage` is the stage after each move, and apps subscribed to `job.retrying` hear of each
retry (`job.stage` only of a stage reached).

## Lanes

`priority` is `interactive` (the default) or `batch`. An account's waiting interactive jobs are numbered
(`queue_position`) and started ahead of its waiting batch jobs, each lane oldest first. Lanes order an
account's own queue only: which account's job a provider's free slot goes to never looks at them, so an
account's batch job keeps its account's turn however many interactive jobs other accounts queue.

## Model aliases

A `model` may be an alias (`GET /v1/models` lists under each model the aliases that route to it). An alias
sends each account to one of its models, by the shares the operator sets: all of an account's jobs through
an alias go to the same model until those shares change, and across accounts each model takes its share.
A job's `model` is the model it was sent to; an estimate names the model a create by the same account would
be sent to now.

## Uploads

`POST /v1/uploads` takes the raw image as its body (PNG, JPEG or WebP, at most `VIDJOBS_UPLOAD_MAX_BYTES`).
The gateway reads only its first bytes: a body larger than the limit is `413`, one that is not an accepted
format (whatever its `Content-Type` claims) is `415`, and a header that is cut short or declares more pixels
than `VIDJOBS_UPLOAD_MAX_SIDE` / `VIDJOBS_UPLOAD_MAX_PIXELS` allow is `422` `invalid_input`. Anything else is
answered `201` with the upload, `status` `processing`, and a `Location` to read it at; no image is decoded by
the API. While processing, `width` and `height` are what the header declares and `bytes` what was received.
The media worker then decodes the image (within the same limits, and against compressed chunks that inflate
past what it decodes), turns it upright by its EXIF orientation and stores it re-encoded from its pixels
alone; the upload becomes `ready`, with the stored image's `width`, `height` and `bytes`, usually within a
second. An image that cannot be decoded becomes `rejected`, with `error.code` `image_corrupt` (truncated or
corrupt), `image_too_large` (a decompression bomb, or more pixels than the limits) or `image_unprocessed`
(it could not be processed on our side, or not within `VIDJOBS_UPLOAD_PROCESSING_DEADLINE_S`), and
`error.message` in words. `GET /v1/uploads/{id}` shows where it stands. A job (or an estimate) naming an
upload still `processing` is refused `409` `upload_not_ready`, retryable, with `Retry-After: 1`: send it
again once the upload is ready. One naming a `rejected` upload is `422` `upload_rejected`, not retryable.
Another account's upload id, or a deleted one, is `422` `invalid_input` as an id that never existed. Every
upload counts against the account's daily cap, rejected ones too. The client library's `upload()` and
`vidjobs render --image` wait until the upload is ready.

## Failover

A job may name `fallback_models` (up to 3, in order; aliases are resolved when it is created), or it takes
its account's default list (`PATCH /v1/account`; a job's `[]` opts out), and a `max_wait_s`. While it waits
it moves to the first of them that can start it sooner:
- when its provider is unavailable (its circuit breaker holds every job back), to any fallback whose own
  provider is not;
- when its estimated start (`estimate.start_p50`) is later than `created_at` + `max_wait_s`, to a fallback
  that has a slot free with nobody waiting, or whose own estimate for a job joining its queue now is sooner.

A fallback must render the same request (duration, ratio, resolution, params) for no more than the job's
quote on the rate card it was priced with. A cheaper one lowers the reservation to its own quote (a `reprice`
entry in the ledger, and `cost.estimated_credits` falls); a dearer one is never used: named by the job it is
refused at create with 422, and in the account's default it is left out of that job's list. Each move is in
the job's trail (`GET /v1/jobs/{id}/events`, from `pending` to `pending`, with the models and the reason),
is told to the account's webhook endpoints as `job.moved`, and is counted in `vidjobs_job_moves_total` by
model, route and reason. `fallback_models` then lists only those after the model it moved to. Without
fallbacks a job never moves.

## Render deadlines and rerunning

A render has a deadline from when its provider accepted it, shown while it renders as `deadline_at`: the p99
of how long the model's renders took here (the renders the estimates measure), with a margin, between a floor
and a ceiling (by default 1.5 x p99, between 2 and 15 minutes; 15 minutes while fewer than 20 renders of the
model are measured; a deployment may set each part per provider). A render still unfinished at its deadline
is stopped at the provider and the job fails with `error.code` `render_timeout` (`retryable` true: the same
request may well render in time later); its credit reservation is released, and the account pays only what
the provider billed for the render, if anything. It is not tried again by itself (a deployment may allow
that per provider): whether another paid render is worth it is its owner's choice.

`POST /v1/jobs/{id}/rerun` renders a job's request again as a new job, which names the original in
`rerun_of` (null on every other job): the same model (through the same alias, chosen again), prompt, format,
seed, input image, params, metadata, webhook, priority and `max_wait_s`, with the account's default fallback
models as they stand. It is checked and priced as a create is at the time of the rerun (a model no longer
offered, or an input image deleted since, answers 422) and reserves its own credit. Any of the account's jobs
may be rerun, whatever its status; a deleted one answers 409 `conflict`, another account's 404. An
`Idempotency-Key` makes a rerun safe to send again (the same key answers the same new job, 200 with
`Idempotent-Replayed: true`); a key is bound to the job it reran, so using it for a create or another rerun
answers 409.
## What a job costs

A job's `cost.estimated_credits` is reserved when it is created and is the most it can be charged. When it
ends it is charged `cost.actual_credits`: for a delivered render (or one the provider finished before it was
canceled or deleted) what the provider billed for that render, converted at the rate card the job was priced
with, or the estimate where the provider did not say; for a failed or canceled one, what the provider billed
for the attempt at hand, if anything; never more than the estimate. A transient failure is retried as a new
attempt (`attempt`), and a provider may bill each attempt's render, even one that failed part-way.
`cost.provider_credits` is what the provider billed for all of the job's attempts, in credits at its rate
card (null while no attempt's bill is known); `cost.absorbed_credits`, once the job ended (null until then),
is the part the platform paid and did not charge: the bills of the attempts before the one charged, and what
that one's bill exceeds the estimate by. The ledger says the same: a job whose settlement absorbed anything
has an `absorb` entry with that amount in `absorbed`, which changes neither the balance nor the reservation.

## Credentials

Three kinds, told apart by their prefix; each route's `x-vidjobs-access` in the OpenAPI document says which
may call it, and tests/test_authorization.py checks every route against every kind.

- **An account's API key** (`vj_…`): every account route (`/v1/jobs`, `/v1/uploads`, `/v1/account`, ...),
  never a platform route (403).
- **A platform key** (`vjp_…`), made by the operator (`vidjobs platform-keys create --platform NAME --scopes
  ...`): the `/v1/platform/...` routes its scopes allow (`accounts`, `credits`, `keys`, `tokens`, `usage`;
  `GET /v1/platform` and `/v1/platform/audit` need none), for the accounts its platform made only (another
  platform's answers 404). With the `act` scope and `Vidjobs-Account: <account id>` it calls that account's
  routes as the account would. Every request it makes that may change something is written to the platform's
  audit trail (`GET /v1/platform/audit`). Rotated with an overlap (`vidjobs platform-keys rotate`), revoked at
  once (`vidjobs platform-keys revoke`); a revoked or expired key is refused within 5 s on every gateway.
- **A browser token** (`vjt_…`), minted by the account (`POST /v1/account/tokens`) or its platform (`POST
  /v1/platform/accounts/{account_id}/tokens`) for 60 s to an hour: what a person's browser holds. Its scopes
  are `read` (list, read, stream and trail its jobs), `create` (create jobs, within its `credit_ceiling` if
  it has one) and `upload` (upload input images); any token may list models and ask for estimates. It may be
  limited to named jobs (and the jobs it creates). On a GET it may come as the `access_token` query parameter,
  for EventSource, which cannot send a header; nothing else may, and the parameter is never logged. It dies at
  its expiry, and within 5 s once its issuer's key is revoked or its account deleted.

## Usage

`GET /v1/account/usage?group_by=&from=&to=` sums the account's jobs created in [`from`, `to`) for billing
its own users: per model, UTC day (the default) or value of one of its metadata keys (`metadata.<key>`; the
jobs without the key are one group with key null, listed last), the jobs and how many are in each status,
the credits charged (the jobs that ended) and still held (the estimates of those that have not), and the
seconds of video delivered (completed jobs, as stored). `from` and `to` are ISO-8601 times with an offset; by
default the 30 days up to now; at most 366 days apart, `from` before `to`. Deleted jobs are left out, as from
every read (their charges stay in the ledger). At most 1000 groups are answered, in key order; `truncated`
says when there were more (ask for a shorter range). A bad `group_by` (anything else, or a key that is not
1-40 letters, digits, `_`, `.` or `-`), a time without an offset, a range backwards or too long, or an unknown
parameter answers 422 `invalid_input` naming the parameter; a parameter given twice, 400.
"""


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[1]
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map of {_type(schema['additionalProperties'])}"
    return str(kind) + (f" ({schema['format']})" if "format" in schema else "")


def _note(param: dict[str, Any]) -> str:
    schema = param["schema"]
    return param.get("description") or schema.get("description") or next(
        (s["description"] for s in schema.get("anyOf", []) if "description" in s), "")


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", "", op["summary"] + ("" if op["security"] else " (no API key)"), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | |", "|---|---|---|---|"]
        lines += [f"| `{p['name']}` | {p['in']} | {_type(p['schema'])} | {_note(p)} |" for p in params]
        lines.append("")
    body = op.get("requestBody", {})
    optional = "" if body.get("required", True) else " (optional: leave it out for the defaults)"
    for media, spec in body.get("content", {}).items():
        lines += [f"Body: {_type(spec['schema']) if media == 'application/json' else media}{optional}", ""]
    answers = []
    for status, answer in op["responses"].items():
        content = answer.get("content", {})
        shown = next((_type(c["schema"]) if m == "application/json" else m for m, c in content.items()), "empty")
        answers.append(f"{status} {shown}")
    lines += ["Answers: " + "; ".join(answers), ""]
    return lines


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    if "properties" not in schema:
        return [*lines, f"{_type(schema)}", ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | |", "|---|---|---|"]
    for field, prop in schema["properties"].items():
        note = prop.get("description") or next((s["description"] for s in prop.get("anyOf", [])
                                                if "description" in s), "")
        if field not in required:
            note = f"{note} (optional)" if note else "optional"
        lines.append(f"| `{field}` | {_type(prop)} | {note} |")
    return [*lines, ""]


_ERRORS = """## Errors

Every code an error answer (`error.code`) or a failed job (its `error.code`) can carry. A job's codes are
also answered by the API where they fit; `retryable` in an answer says whether the same request may succeed
later.
"""


def markdown(doc: dict[str, Any]) -> str:
    lines = [_INTRO, _ERRORS, error_table(), "## Routes", ""]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            lines += _operation(method, path, op)
    lines += ["## Schemas", ""]
    for name, schema in sorted(doc["components"]["schemas"].items()):
        lines += _schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def reference() -> str:
    """The page for a deployment as `vidjobs up` runs it (files served by the gateway, metrics on it)."""
    return markdown(document(route_table(Settings(fake_provider="on"))))


if __name__ == "__main__":
    sys.stdout.write(reference())
