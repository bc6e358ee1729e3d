"""HTTP details every provider adapter shares: the call and its transport failures (timeouts included),
decoding, `Retry-After`, and the status → error-code table each provider fills with its own words."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, NamedTuple, TypeVar

import aiohttp
import msgspec

from vidjobs.common import signatures
from vidjobs.common.errors import DEFAULT_MESSAGES, ErrorCode, JobError, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import Settings
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest

T = TypeVar("T")


MAX_RETRY_AFTER_S = 86400.0  # a day: whoever sent the header, we never wait longer than this on its word


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date, between 0 and MAX_RETRY_AFTER_S (the
    sender controls it: `1e300` or `inf` would overflow every timestamp it is added to). None when absent or
    unreadable."""
    if not value or len(value) > 64:
        return None
    seconds: float | None
    try:
        seconds = float(value)
    except ValueError:
        seconds = _until(value)
    if seconds is None or math.isnan(seconds):
        return None
    return min(MAX_RETRY_AFTER_S, max(0.0, seconds))


def _until(value: str) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime.now(UTC)).total_seconds()


@contextlib.asynccontextmanager
async def transport_errors(
    provider: str, method: str, path: str, *, detail: bool = True,
) -> AsyncIterator[None]:
    """A call that never reached an answer, in our taxonomy. `detail=False` keeps the library's message
    out of ours, for providers whose URLs or headers must never be echoed."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:  # no connection was made: the request was never sent
        raise ProviderError(ErrorCode.PROVIDER_UNAVAILABLE, f"{provider} could not be reached in time.") from exc
    except TimeoutError as exc:  # before ClientError: aiohttp's timeouts are both
        raise ProviderError(ErrorCode.TIMEOUT, f"{provider} did not answer {method} {path} in time.",
                            unclear=True) from exc
    except aiohttp.ClientError as exc:
        said = str(exc) if detail else type(exc).__name__
        raise ProviderError(ErrorCode.PROVIDER_UNAVAILABLE, f"{provider} could not be reached: {said}",
                            unclear=sent_maybe(exc)) from exc


def call_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """The time limits of one call to a provider, for the session the adapters share: connecting within
    `provider_connect_timeout_s`, the whole call within `provider_timeout_s`. A provider that accepts the
    connection and never answers (a stalled server, a half-open connection) ends in an unclear outcome after
    the latter, and the connection is closed, never reused."""
    return aiohttp.ClientTimeout(total=settings.provider_timeout_s,
                                 sock_connect=min(settings.provider_connect_timeout_s, settings.provider_timeout_s))


def sent_maybe(exc: aiohttp.ClientError) -> bool:
    """Whether a failed call may have reached the provider: only a connection that was never made (refused,
    unresolvable, TLS refused) proves the request was not sent."""
    return not isinstance(exc, aiohttp.ClientConnectorError)


# --- an error answer, in our taxonomy ----------------------------------------------------------------------


class Answer(NamedTuple):
    """One HTTP answer, whatever its status."""

    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Refusal(NamedTuple):
    """What one kind of error answer means: our code, and a message template (`{title}`, `{status}`, `{said}`)."""

    code: ErrorCode
    message: str


class Said(NamedTuple):
    """An error answer's body, read by the provider's own rules."""

    text: str = ""  # the provider's own words, for a person
    refusal: Refusal | None = None  # where the body decides the meaning, in place of the status
    retry_after: float | None = None  # a wait the body names, used when no Retry-After header came


# Every provider agrees on these, whatever its body says; they are checked before the provider's reading.
RATE_LIMITED = Refusal(ErrorCode.RATE_LIMITED, "{title} is rate limiting us: {said}")
TIMED_OUT = Refusal(ErrorCode.TIMEOUT, "{title} timed out: {said}")
UNAVAILABLE = Refusal(ErrorCode.PROVIDER_UNAVAILABLE, "{title} is unavailable: {said}")
# An unexpected 404 and the like: our configuration is wrong (an address that is not the provider's API, a
# route or model it does not have), not the job; every call would meet it until an operator fixes it.
REFUSED_CALL = Refusal(ErrorCode.PROVIDER_MISCONFIGURED, "{title} refused our call ({status}: {said}); our "
                                                         "configuration of it is wrong and our operators are alerted.")
INPUT_STATUSES = (400, 409, 413, 415, 422)  # answers that judge the request itself
# Our account with the provider is out of credit: not the job's account, and every call is refused until it is
# topped up. What 402 means at any provider, and what a provider's words may make of another answer.
NO_CREDIT = Refusal(ErrorCode.QUOTA_EXHAUSTED, "{title} says our account with it is out of credit ({said}); your "
                                               "own credit is untouched and our operators are alerted: render it "
                                               "again later.")
CONTENT_REFUSED = Refusal(ErrorCode.CONTENT_REJECTED, "{title} refused the request: {said}")
# What a status means where a provider's table does not say.
DEFAULT_ROWS = {402: NO_CREDIT}


def quiet(status: int, body: bytes) -> Said:
    """The reading of a provider whose error bodies carry nothing we use."""
    return Said()


@dataclass(frozen=True)
class ErrorTable:
    """A provider's status → error-code table, as data, with the reader of its error bodies."""

    title: str  # the provider as a person reads its name in a message
    rows: Mapping[int, Refusal]
    read: Callable[[int, bytes], Said] = quiet
    # Where a provider's codes say nothing, its words may: our account out of credit (whatever the status but a
    # refused key), the content refused (in an answer that judges the request), and, in a failed render's reason
    # only, a render that timed out.
    credit_words: re.Pattern[str] | None = None
    content_words: re.Pattern[str] | None = None
    timeout_words: re.Pattern[str] | None = None

    def error(self, status: int, body: bytes, headers: Mapping[str, str]) -> ProviderError:
        """An error answer in our taxonomy, carrying the provider's own words where it gave any."""
        said = self.read(status, body)
        refusal = self.refusal(status, said)
        message = refusal.message.format(title=self.title, status=status, said=said.text or f"HTTP {status}")
        wait = None
        if status == 429:
            wait = retry_after(headers.get("Retry-After"))
            wait = said.retry_after if wait is None else wait
        return ProviderError(refusal.code, message, retry_after=wait)

    def failure(self, reason: str | None) -> JobError:
        """A failed render's reason in our taxonomy, read by the provider's words as its error answers are; a
        reason they do not place counts as a transient failure of the render."""
        text = (reason or "").strip()
        if self.content_words and self.content_words.search(text):
            return said_error(ErrorCode.CONTENT_REJECTED, self.title, text)
        if self.credit_words and self.credit_words.search(text):
            return JobError.of(NO_CREDIT.code, NO_CREDIT.message.format(title=self.title, said=text))
        if self.timeout_words and self.timeout_words.search(text):
            return said_error(ErrorCode.TIMEOUT, self.title, text)
        return said_error(ErrorCode.PROVIDER_UNAVAILABLE, self.title, text)

    def refusal(self, status: int, said: Said) -> Refusal:
        if status == 429:
            return RATE_LIMITED
        if status >= 500:
            return UNAVAILABLE
        if status == 408:
            return TIMED_OUT
        if said.refusal is not None:
            return said.refusal
        if self.credit_words and status not in (401, 403) and self.credit_words.search(said.text):
            return NO_CREDIT
        if self.content_words and status in INPUT_STATUSES and self.content_words.search(said.text):
            return CONTENT_REFUSED
        return self.rows.get(status) or DEFAULT_ROWS.get(status, REFUSED_CALL)


def key_refused(message: str) -> Refusal:
    """Our key refused (`message` names the setting that holds it): no call passes until an operator fixes it."""
    return Refusal(ErrorCode.PROVIDER_MISCONFIGURED, f"{message.rstrip('.')}; our operators are alerted.")


def rows(statuses: Iterable[int], refusal: Refusal) -> dict[int, Refusal]:
    """One refusal for several statuses, to build a table from."""
    return dict.fromkeys(statuses, refusal)


def refusals(key_setting: str, *, key: str = "API key", inputs: Iterable[int] = INPUT_STATUSES) -> dict[int, Refusal]:
    """The rows most providers share: a refused key is our configuration (the message names its setting), a
    refused request is the job's."""
    return {
        **rows((401, 403), key_refused(f"{{title}} refused our {key} ({{status}}: {{said}}); check the {key_setting} "
                                       "setting.")),
        **rows(inputs, Refusal(ErrorCode.INVALID_INPUT, "{title} refused the request: {said}")),
    }


# --- the adapter's half of the conversation ---------------------------------------------------------------


def read_or_none(raw: bytes, kind: type[T]) -> T | None:
    """An error answer's body as the Struct a provider writes it in, or None when it is some other page."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError:
        return None


def detail_text(detail: Any) -> str:
    """An error body's `detail` as a person reads it: a sentence, or (for a request that breaks the schema) each
    `{"loc": [...], "msg": ...}` entry as `field.path: message`."""
    if isinstance(detail, str):
        return " ".join(detail.split())
    parts = []
    for item in detail if isinstance(detail, list) else ():
        if isinstance(item, dict):
            where = ".".join(str(p) for p in item.get("loc", []) if p != "body")
            parts.append(f"{where}: {item.get('msg', '')}" if where else str(item.get("msg", "")))
    return "; ".join(parts)


class DetailAnswer(msgspec.Struct, kw_only=True):
    """An error body of the common `{"detail": ...}` shape (FastAPI's): a sentence, or (for a request that breaks
    the schema) a list of `{"loc": [...], "msg": ...}`."""

    detail: Any = None


def detail_said(body: bytes) -> str | None:
    """The words of a `{"detail": ...}` error body; None for a body of any other shape (not the provider's own)."""
    answer = read_or_none(body, DetailAnswer)
    return detail_text(answer.detail) if answer is not None and answer.detail is not None else None


def read_detail(status: int, body: bytes) -> Said:
    """The reading of a provider whose error bodies are `{"detail": ...}`."""
    return Said(detail_said(body) or "")


def said_error(code: ErrorCode, who: str, said: str | None) -> JobError:
    """A failed render's error: our words for the code, then the provider's own (at most 500 characters)."""
    detail = f" {who} said: {said[:500]}" if said else ""
    return JobError.of(code, DEFAULT_MESSAGES[code] + detail)


def decode(raw: bytes, kind: type[T], who: str, what: str = "answer") -> T:
    """A provider's answer as the Struct we read it into; a malformed one is ProviderError(INTERNAL)."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
        raise ProviderError(ErrorCode.INTERNAL, f"{who} sent a malformed {what}: {exc}") from exc


async def read_image(session: aiohttp.ClientSession, url: str | None, types: Iterable[str],
                     max_bytes: int) -> tuple[bytes, str]:
    """An input image fetched for a provider that takes images inline: its bytes and media type. One that
    cannot be read, is not of `types` or is larger than `max_bytes` is refused naming `input_image`."""
    if not url:
        raise ProviderError(ErrorCode.INVALID_INPUT, "input_image: the image has no address to read it from")
    limit = f"{' or '.join(t.removeprefix('image/').upper() for t in types)} image up to {max_bytes // 2**20} MB"
    try:
        async with session.get(url) as resp:
            mime = resp.content_type
            if resp.status != 200 or mime not in types or (resp.content_length or 0) > max_bytes:
                raise ProviderError(ErrorCode.INVALID_INPUT, f"input_image: cannot be read as a {limit} "
                                                             f"(HTTP {resp.status}, {mime})")
            data = bytearray()
            async for chunk in resp.content.iter_chunked(1 << 16):
                data += chunk
                if len(data) > max_bytes:
                    raise ProviderError(ErrorCode.INVALID_INPUT, f"input_image: larger than a {limit}")
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ProviderError(ErrorCode.INTERNAL, f"the input image could not be read: {type(exc).__name__}") \
            from exc
    return bytes(data), mime


def first_url(output: object) -> str | None:
    """A render's URL from an output that is the URL itself or a list of them (the first)."""
    if isinstance(output, list):
        output = next((item for item in output if isinstance(item, str)), None)
    return output if isinstance(output, str) and output else None


def image_address(req: SubmitRequest, title: str) -> str:
    """The address a provider fetches the request's input image from; the gateway gives every uploaded image one,
    so a missing one is our fault, not the job's."""
    if not req.input_image_url:
        raise ProviderError(ErrorCode.INTERNAL, f"The input image has no address {title} could fetch.")
    return req.input_image_url


def lost(provider_job_id: str, message: str) -> ProviderSignal:
    """A job the provider no longer knows: it will never finish, so the attempt has failed."""
    error = JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, message)
    return ProviderSignal(provider_job_id=provider_job_id, state=ProviderState.FAILED, error=error)


class HttpAdapter:
    """What every HTTP provider adapter does the same way: the call, its failures, and the protocol's
    defaults. A subclass names itself, fills its `errors` table and says how it authenticates."""

    name: ClassVar[str]
    errors: ClassVar[ErrorTable]
    supports_callbacks: bool = False
    # False: the HTTP library's own words never reach our messages (they may name a keyed URL).
    echo_transport: ClassVar[bool] = True
    # The header that carries the API key, and its value around the key; None for a provider without one.
    key_header: ClassVar[tuple[str, str] | None] = ("Authorization", "Bearer {}")
    api_headers: ClassVar[Mapping[str, str]] = {}  # what every call carries besides the key (an API version)
    forgotten: ClassVar[str] = "The provider no longer knows this render."  # a polled job it has no record of

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str = ""):
        self.session = session  # the caller's: closed by the caller
        self.base_url = base_url.rstrip("/")
        self._auth = dict(self.api_headers)  # never logged, never part of a message
        if self.key_header is not None:
            header, value = self.key_header
            self._auth[header] = value.format(api_key)

    def __repr__(self) -> str:  # never a key
        return f"{type(self).__name__}({self.base_url!r})"

    def auth_headers(self) -> dict[str, str]:
        """The headers every API call carries: the key, and any the API wants besides."""
        return self._auth

    def says_missing(self, body: bytes) -> bool:
        """Whether a 404's body is the provider's own "no such job", not some other server's page."""
        return True

    def read(self, raw: bytes, kind: type[T], what: str = "answer") -> T:
        """One of the provider's answers as the Struct we read it into (`decode`, naming the provider)."""
        return decode(raw, kind, self.errors.title, what)

    async def answer(self, method: str, path: str, **kwargs: Any) -> Answer:
        """The provider's answer, whatever its status; only failing to get one raises (as a ProviderError)."""
        headers = {**kwargs.pop("headers", {}), **self.auth_headers()}
        async with transport_errors(self.errors.title, method, path, detail=self.echo_transport):
            async with self.session.request(method, self.base_url + path, headers=headers, **kwargs) as resp:
                return Answer(resp.status, await resp.read(), resp.headers)

    async def call(self, method: str, path: str, **kwargs: Any) -> bytes:
        """The body of a 2xx answer; every other outcome raised as a ProviderError of our taxonomy."""
        answer = await self.answer(method, path, **kwargs)
        if not answer.ok:
            raise self.errors.error(*answer)
        return answer.body

    async def send(self, path: str, body: Any, headers: Mapping[str, str] | None = None, **kwargs: Any) -> bytes:
        """POST a body (a Struct, or the provider's own dict) as JSON; the body of the 2xx answer, as `call`."""
        headers = {"Content-Type": "application/json", **(headers or {})}
        return await self.call("POST", path, data=msgspec.json.encode(body), headers=headers, **kwargs)

    async def call_known(self, method: str, path: str, **kwargs: Any) -> bytes | None:
        """As `call`, but None when the provider says it has no such job (the caller gives that a meaning)."""
        answer = await self.answer(method, path, **kwargs)
        if answer.status == 404 and self.says_missing(answer.body):
            return None
        if not answer.ok:
            raise self.errors.error(*answer)
        return answer.body

    async def poll(self, path: str, provider_job_id: str, read: Callable[[bytes], ProviderSignal]) -> ProviderSignal:
        """A status poll: the provider's answer, `read` as a signal. A job it says it has no longer will never
        finish (deleted, forgotten in a restart), so the attempt has failed, in the words of `forgotten`."""
        raw = await self.call_known("GET", path)
        return lost(provider_job_id, self.forgotten) if raw is None else read(raw)

    def models(self) -> list[ModelInfo]:
        raise NotImplementedError

    def validate(self, request: JobRequest) -> None:
        raise NotImplementedError

    async def find(self, req: SubmitRequest) -> Submission | None:
        # Most providers take no idempotency key and cannot be asked for an attempt by anything of ours. What
        # keeps a crash from rendering twice is the submission row claimed before the call and updated with the
        # provider's id as soon as it answers; only a submitter that died inside the call may resubmit.
        return None

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        raise WebhookRejected(f"{self.name} sends no callbacks")

    def parse_callback(self, body: bytes) -> ProviderSignal:
        raise ProviderError(ErrorCode.INTERNAL, f"{self.name} sends no callbacks; this stored payload is not "
                                                f"{self.errors.title}'s")

    def download_headers(self) -> dict[str, str]:
        # Most providers serve outputs from a CDN without credentials: our key never goes to a host a body names.
        return {}

    async def close(self) -> None:
        """The session belongs to the caller; nothing of our own to release."""


class SignedCallbacks:
    """Callbacks signed with Standard Webhooks headers under a `whsec_` secret."""

    def __init__(self, webhook_secret: str, tolerance_s: float):
        if webhook_secret:
            signatures.decode_secret(webhook_secret)  # a malformed secret fails at start, not per callback
        self.webhook_secret = webhook_secret
        self.tolerance_s = tolerance_s

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        return signatures.verify(self.webhook_secret, headers, body, tolerance_s=self.tolerance_s)
