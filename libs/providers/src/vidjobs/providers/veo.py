"""The adapter for Google's Veo: long-running operations started and polled, no callbacks. Veo is served by
two Google APIs, and VIDJOBS_VEO_API picks one: Vertex AI (the one google-genai builds Veo requests for), whose
videos are written to Cloud Storage where we tell it, or the Gemini API (the default, so a deployment's key
keeps working across an upgrade), whose videos are file downloads keyed like any call. veo_wire.py has each
API's routes and answers; docs/PROVIDERS.md the rest."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import msgspec

from vidjobs.common.errors import ConfigError, ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import checks, http, models
from vidjobs.providers.base import Format, ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest
from vidjobs.providers.checks import invalid
from vidjobs.providers.google_rpc import ErrorAnswer, Status
from vidjobs.providers.http import ErrorTable, HttpAdapter, Said, lost, read_or_none, refusals
from vidjobs.providers.veo_wire import APIS, Gemini, Place, Started, Vertex

KEY_SETTING, API_SETTING, OUTPUT_SETTING = "VIDJOBS_VEO_API_KEY", "VIDJOBS_VEO_API", "VIDJOBS_VEO_OUTPUT_URI"
KEY_HEADER = "x-goog-api-key"  # on both APIs, as google-genai sends the key (never in the URL, never logged)
STORAGE_URL = "https://storage.googleapis.com"  # where a gs://bucket/object is read over HTTPS
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # Veo's documented limit for an image-to-video input
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """What one Veo model accepts: a row of `models/veo.toml`."""

    durations: tuple[int, ...]
    frames: str  # its frame set: our (aspect ratio, resolution) -> Veo's aspectRatio
    people: str  # its personGeneration values, from text and from an image
    sends_resolution: bool = True

    def frame_map(self) -> dict[tuple[str, str], str]:
        return FRAMES[self.frames]

    def people_for(self, has_image: bool) -> tuple[str, ...]:
        return tuple(PEOPLE[self.people]["image" if has_image else "text"])


class _Catalog(msgspec.Struct):
    frames: dict[str, dict[str, str]]
    people: dict[str, dict[str, list[str]]]
    models: dict[str, Model]


_CATALOG = models.load("veo", _Catalog)
FRAMES = models.frame_sets(_CATALOG.frames)
PEOPLE, MODELS = _CATALOG.people, _CATALOG.models
FULL_HD_DURATION_S = 8  # Veo 3 renders 1080p as 8 s clips only

# --- the adapter ---------------------------------------------------------------------------------------


def _said(status: int, body: bytes) -> Said:
    answer = read_or_none(body, ErrorAnswer)
    given = answer.error if answer else Status()
    # Google answers a wrong key with 400 INVALID_ARGUMENT; the reason tells it from a bad request.
    wrong_key = given.detail("ErrorInfo").get("reason") in ("API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED")
    return Said(given.message, _KEY_REFUSED if wrong_key else None, given.retry_delay())


ERRORS = ErrorTable("Veo", refusals(KEY_SETTING, inputs=(400, 413, 415, 422)), _said)
_KEY_REFUSED = ERRORS.rows[401]
http_error = ERRORS.error


class VeoAdapter(HttpAdapter):
    name = "veo"
    errors = ERRORS
    echo_transport = False
    key_header = (KEY_HEADER, "{}")

    def __init__(self, session: aiohttp.ClientSession, base_url: str = "", api_key: str = "", *,
                 api: str = "gemini", output_uri: str = "", storage_url: str = STORAGE_URL):
        if api not in APIS:
            raise ConfigError(f"{API_SETTING} must be one of {', '.join(APIS)} (got {api[:40]!r})")
        self.api = APIS[api]
        super().__init__(session, base_url or self.api.url, api_key)
        self.output = Place.parse(output_uri, OUTPUT_SETTING) if output_uri else None
        if self.output is None and isinstance(self.api, Vertex):
            # Told nowhere to write, Vertex AI sends the video back inline, which our media service cannot fetch:
            # refused at start, before any render is paid for or any job fails.
            raise ConfigError(f"{API_SETTING}=vertex needs {OUTPUT_SETTING}: the Cloud Storage place "
                              f"(gs://bucket/prefix/) where Veo writes the videos we fetch")
        self.storage_url = storage_url.rstrip("/")
        self.seeds = isinstance(self.api, Vertex)

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"veo/{name}", durations_s=list(m.durations),
                          formats=[Format(ratio, res, [FULL_HD_DURATION_S] if res == "1080p" else None)
                                   for ratio, res in m.frame_map()], input_image="optional",
                          negative_prompt=True, seed=self.seeds)
                for name, m in MODELS.items()]

    def validate(self, request: JobRequest) -> None:
        model = checks.pick_model(self.name, "Veo", request.model_name, MODELS)
        model_id = f"veo/{request.model_name}"
        checks.check_frame(model_id, model.frame_map(), request)
        checks.check_duration(model_id, model.durations, request)
        if request.resolution == "1080p" and request.duration_s != FULL_HD_DURATION_S:
            raise invalid(f"duration_s: {model_id} renders 1080p as {FULL_HD_DURATION_S} s clips only")
        # Vertex AI's `seed` is a uint32; the Gemini API documents none, so a seed is refused there.
        checks.check_optional(model_id, request, seed=self.seeds, negative_prompt=True, max_seed=checks.UINT32_MAX)
        people = model.people_for(has_image=request.input_image is not None)
        checks.check_params(model_id, request.params, {"person_generation": checks.one_of(*people)})

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        place = self.output.uri if self.output is not None and isinstance(self.api, Vertex) else None
        image = await self._inline_image(req) if req.request.input_image is not None else None
        body = operation_body(req, image, storage_uri=place)
        started = self.read(await self.send(self.api.create(req.request.model_name), body), Started)
        if not self.api.operation.match(started.name):
            raise ProviderError(ErrorCode.INTERNAL, f"Veo named its operation unexpectedly: {started.name[:100]!r}")
        return Submission(provider_job_id=started.name, state=ProviderState.QUEUED)

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        if not self.api.operation.match(provider_job_id):
            raise ProviderError(ErrorCode.INTERNAL, f"not a Veo operation on {self.api.title} "
                                                    f"({API_SETTING}): {provider_job_id[:100]!r}")
        method, path, body = self.api.poll(provider_job_id)
        raw = await self.call_known(method, path, json=body)
        return lost(provider_job_id, "Veo no longer knows this render.") if raw is None else self.read_operation(raw)

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # Neither API documents a way to stop a Veo operation, and google-genai has none. The render runs to its
        # end and its late signals find a finished job, which ignores them.
        return None

    def download_headers(self) -> dict[str, str]:
        # A Gemini API file download is keyed like any call. Cloud Storage takes no API key: our key stays with
        # Vertex AI, and the media service reads the video as it reads any provider's CDN.
        return dict(self.auth_headers()) if isinstance(self.api, Gemini) else {}

    def read_operation(self, raw: bytes) -> ProviderSignal:
        """A polled operation as a signal; ProviderError(INTERNAL) when it breaks the API's schema."""
        try:
            op = self.api.read(raw)
        except msgspec.DecodeError as exc:
            raise ProviderError(ErrorCode.INTERNAL, f"Veo sent a malformed answer: {exc}") from exc
        if not op.done:
            return ProviderSignal(provider_job_id=op.name, state=ProviderState.RUNNING)  # Veo gives no percentage
        if op.error is not None:
            return _errored(op.name, op.error)
        if op.uris:
            return self._video(op.name, op.uris[0])
        if op.inline:
            return _failed(op.name, ErrorCode.INTERNAL, f"Veo sent the video inline, which our media service cannot "
                                                        f"fetch; it writes it to {OUTPUT_SETTING} when that is set.")
        if op.filtered > 0 or op.reasons:
            said = f"Veo's safety filters held the video back. {' '.join(op.reasons)}"
            return _failed(op.name, ErrorCode.CONTENT_REJECTED, said.strip())
        return _failed(op.name, ErrorCode.PROVIDER_UNAVAILABLE, "Veo finished without a video.")

    def _video(self, name: str, uri: str) -> ProviderSignal:
        # A Gemini API file download is fetched as it is, with the key; Vertex AI's only from where we told it.
        url = uri if isinstance(self.api, Gemini) else self.output and self.output.https(uri, self.storage_url)
        if not url:
            return _failed(name, ErrorCode.INTERNAL, f"Veo put the video somewhere other than {OUTPUT_SETTING}.")
        return ProviderSignal(provider_job_id=name, state=ProviderState.SUCCEEDED, output_url=url)

    async def _inline_image(self, req: SubmitRequest) -> dict[str, str]:
        """The input image as Veo takes it: inline, base64-encoded (it fetches no URLs of ours)."""
        data, mime = await http.read_image(self.session, req.input_image_url, IMAGE_TYPES, MAX_IMAGE_BYTES)
        return {"bytesBase64Encoded": base64.b64encode(data).decode(), "mimeType": mime}


# --- translation ---------------------------------------------------------------------------------------


def operation_body(req: SubmitRequest, image: dict[str, str] | None = None, *,
                   storage_uri: str | None = None) -> dict[str, Any]:
    """The JSON body that starts an operation for this request (validated already); both APIs take it, Vertex AI
    with the place to write the video."""
    r = req.request
    model = MODELS[r.model_name]
    instance: dict[str, Any] = {"prompt": r.prompt}
    if image is not None:
        instance["image"] = image
    parameters: dict[str, Any] = {"aspectRatio": model.frame_map()[(r.aspect_ratio, r.resolution)],
                                  "durationSeconds": r.duration_s}
    if model.sends_resolution:
        parameters["resolution"] = r.resolution
    if r.negative_prompt:
        parameters["negativePrompt"] = r.negative_prompt
    if r.seed is not None:
        parameters["seed"] = r.seed
    if "person_generation" in r.params:
        parameters["personGeneration"] = r.params["person_generation"]
    if storage_uri is not None:
        parameters["storageUri"] = storage_uri
    return {"instances": [instance], "parameters": parameters}


def _failed(name: str, code: ErrorCode, said: str) -> ProviderSignal:
    return ProviderSignal(provider_job_id=name, state=ProviderState.FAILED, error=http.said_error(code, "Veo", said))


def _errored(name: str, status: Status) -> ProviderSignal:
    if status.code_name == "CANCELLED":
        return ProviderSignal(provider_job_id=name, state=ProviderState.CANCELED)
    said = f"{status.code_name}: {status.message}" if status.message else status.code_name
    return _failed(name, status.meaning, said)
