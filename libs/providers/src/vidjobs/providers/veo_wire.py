"""Veo's two Google APIs on the wire, as far as the adapter reads them: where each starts and polls an
operation, the names it gives operations, what a polled operation says, and where Vertex AI writes a video.

Vertex AI is the API google-genai (3.3.0) builds Veo requests for, in express mode: our API key in
`x-goog-api-key`, the routes on the SDK's version (v1beta1), an operation polled with POST
`{model}:fetchPredictOperation`. The Gemini API's `predictLongRunning` is a route only its REST docs still
describe (the SDK refuses to build it); its operations are read as the SDK reads them, GET `/v1/{name}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple
from urllib.parse import quote

import msgspec

from vidjobs.common.errors import ConfigError
from vidjobs.providers.google_rpc import Status

ApiName = Literal["vertex", "gemini"]
_ID = r"[A-Za-z0-9._-]{1,128}"


class Reading(NamedTuple):
    """A polled operation, whichever API it came from."""

    name: str
    done: bool
    error: Status | None
    uris: list[str]  # where the video is (Vertex AI: gs:// URIs; the Gemini API: its file downloads)
    inline: bool  # a video sent in the answer itself, which nothing downstream can fetch
    filtered: int  # videos held back by the safety filters
    reasons: list[str]  # and why, in Veo's words


# --- Vertex AI: `{"response": {"videos": [{"gcsUri" | "bytesBase64Encoded", "mimeType"}], "raiMediaFiltered...`,
# the fields google-genai's _GenerateVideosResponse_from_vertex reads.


class _VertexVideo(msgspec.Struct, rename="camel"):
    gcs_uri: str | None = None
    bytes_base64_encoded: str | None = None


class _VertexVideos(msgspec.Struct, kw_only=True, rename="camel"):
    videos: list[_VertexVideo] = []
    rai_media_filtered_count: int = 0
    rai_media_filtered_reasons: list[str] = []


class _VertexOperation(msgspec.Struct, kw_only=True):
    name: str
    done: bool = False
    error: Status | None = None
    response: _VertexVideos | None = None


# --- the Gemini API: `{"response": {"generateVideoResponse": {"generatedSamples": [{"video": {"uri"}}], ...}}}`.


class _GeminiVideo(msgspec.Struct):
    uri: str | None = None


class _Sample(msgspec.Struct):
    video: _GeminiVideo | None = None


class _GeminiVideos(msgspec.Struct, kw_only=True, rename="camel"):
    generated_samples: list[_Sample] = []
    rai_media_filtered_count: int = 0
    rai_media_filtered_reasons: list[str] = []


class _GeminiResponse(msgspec.Struct, rename="camel"):
    generate_video_response: _GeminiVideos | None = None


class _GeminiOperation(msgspec.Struct, kw_only=True):
    name: str
    done: bool = False
    error: Status | None = None
    response: _GeminiResponse | None = None


class Started(msgspec.Struct):
    """A `predictLongRunning` answer, on either API: the operation's name."""

    name: str


class Poll(NamedTuple):
    method: str
    path: str
    body: dict[str, str] | None


class Api:
    """One of the two APIs, as the adapter calls it."""

    name: ClassVar[ApiName]
    title: ClassVar[str]
    url: ClassVar[str]  # its public base URL
    operation: ClassVar[re.Pattern[str]]  # a name it hands out; nothing else reaches a request path

    def create(self, model: str) -> str:
        raise NotImplementedError

    def poll(self, operation: str) -> Poll:
        raise NotImplementedError

    def read(self, raw: bytes) -> Reading:
        """Raises msgspec.DecodeError for an answer that breaks the schema."""
        raise NotImplementedError


class Vertex(Api):
    name, title, url = "vertex", "Vertex AI", "https://aiplatform.googleapis.com"
    # Express mode answers with the operation under our project and location; the SDK takes the bare form too.
    operation = re.compile(rf"^(?:projects/[a-z0-9-]{{1,64}}/locations/[a-z0-9-]{{1,64}}/)?publishers/google/models/"
                           rf"{_ID}/operations/{_ID}$")

    def create(self, model: str) -> str:
        return f"/v1beta1/publishers/google/models/{quote(model, safe='')}:predictLongRunning"

    def poll(self, operation: str) -> Poll:
        model = operation.rpartition("/operations/")[0]
        return Poll("POST", f"/v1beta1/{quote(model, safe='/')}:fetchPredictOperation", {"operationName": operation})

    def read(self, raw: bytes) -> Reading:
        op = msgspec.json.decode(raw, type=_VertexOperation)
        got = op.response or _VertexVideos()
        return Reading(op.name, op.done, op.error, [v.gcs_uri for v in got.videos if v.gcs_uri],
                       any(v.bytes_base64_encoded for v in got.videos), got.rai_media_filtered_count,
                       got.rai_media_filtered_reasons)


class Gemini(Api):
    name, title, url = "gemini", "the Gemini API", "https://generativelanguage.googleapis.com"
    operation = re.compile(rf"^models/{_ID}/operations/{_ID}$")

    def create(self, model: str) -> str:
        return f"/v1beta/models/{quote(model, safe='')}:predictLongRunning"

    def poll(self, operation: str) -> Poll:
        return Poll("GET", f"/v1/{quote(operation, safe='/')}", None)

    def read(self, raw: bytes) -> Reading:
        op = msgspec.json.decode(raw, type=_GeminiOperation)
        got = (op.response and op.response.generate_video_response) or _GeminiVideos()
        uris = [s.video.uri for s in got.generated_samples if s.video is not None and s.video.uri]
        return Reading(op.name, op.done, op.error, uris, False, got.rai_media_filtered_count,
                       got.rai_media_filtered_reasons)


APIS: dict[str, Api] = {"vertex": Vertex(), "gemini": Gemini()}

# --- Cloud Storage, where Vertex AI writes a video when told to (`storageUri`) --------------------------------

_BUCKET = r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"
_PLACE = re.compile(rf"^gs://({_BUCKET})(?:/(.*))?$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._~=+-]{1,255}$")  # an object name part we put in a URL, `.` and `..` aside


@dataclass(frozen=True)
class Place:
    """A bucket and a prefix in it: `gs://bucket/prefix/`."""

    bucket: str
    prefix: str  # empty, or ending in `/`

    @classmethod
    def parse(cls, uri: str, setting: str) -> Place:
        found = _PLACE.match(uri)
        prefix = (found.group(2) or "").strip("/") if found else ""
        if found is None or (prefix and not all(_SEGMENT.match(p) and p not in (".", "..")
                                                for p in prefix.split("/"))):
            raise ConfigError(f"{setting} must be a Cloud Storage place, gs://bucket/prefix/ (got {uri[:100]!r})")
        return cls(found.group(1), f"{prefix}/" if prefix else "")

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    def https(self, gcs_uri: str, storage_url: str) -> str | None:
        """The HTTPS address of an object Vertex AI wrote here; None for anything else (another bucket or
        prefix, a name that would climb out of it or is not plain)."""
        found = _PLACE.match(gcs_uri)
        if found is None or found.group(1) != self.bucket or len(gcs_uri) > 1100:
            return None
        name = found.group(2) or ""
        parts = name.split("/")
        if not name.startswith(self.prefix) or not all(_SEGMENT.match(p) and p not in (".", "..") for p in parts):
            return None
        return f"{storage_url}/{self.bucket}/{name}"
