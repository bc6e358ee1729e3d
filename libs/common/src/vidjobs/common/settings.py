"""One typed settings object, read from `VIDJOBS_*` environment variables.

Every service and the CLI read the same object, so a variable means the same thing everywhere. Unknown
`VIDJOBS_*` variables are refused: a typo in a deployment should fail loudly, not silently use a default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from vidjobs.common.errors import ConfigError
from vidjobs.common.imageheaders import Limits

PREFIX = "VIDJOBS_"

# Settings whose environment value is JSON.
_JSON_FIELDS = {"retry_policies", "provider_limits", "model_routes", "render_deadlines"}

# Variables the test harness and CLI set for their own use; they are not service settings.
_NOT_SETTINGS = {"VIDJOBS_TEST_DATABASE_URL", "VIDJOBS_TEST_NATS_URL", "VIDJOBS_FAULTS_LOGS", "VIDJOBS_ABUSE_FIGURES",
                 "VIDJOBS_FAULTS_LONG", "VIDJOBS_FAULTS_BACKLOG", "VIDJOBS_FUZZ_EXAMPLES", "VIDJOBS_FUZZ_SEED",
                 "VIDJOBS_TEST_LOCKS", "VIDJOBS_PORT_SLICE",
                 # the client and the `vidjobs render` family read these: where the API is, and the key
                 "VIDJOBS_URL", "VIDJOBS_API_KEY", "VIDJOBS_CONFIG",
                 # ... and `vidjobs platform` and the client's `Platform` this one: a product's platform key
                 "VIDJOBS_PLATFORM_KEY"}


class ProviderPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Retry policy overrides for one provider; unset fields take the global settings."""

    max_attempts: int | None = None
    base_s: float | None = None
    cap_s: float | None = None
    # No retry starts this long after the job's creation. Unset: as long as its attempts may take under the
    # provider's render deadlines (vidjobs.common.retry.elapsed_bound).
    max_elapsed_s: float | None = None
    # A render past its deadline (`render_timeout`) is tried again as a new attempt (a new paid render) only
    # where this is true; by default the job fails and its owner decides whether to render it again.
    retry_on_timeout: bool | None = None


class DeadlinePolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Render deadline overrides for one provider; unset fields take the global settings."""

    floor_s: float | None = None
    ceiling_s: float | None = None
    margin: float | None = None
    unmeasured_s: float | None = None  # while too few renders are measured (the global: render_deadline_s)
    min_samples: int | None = None


class ProviderLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How hard we may push one provider, across every submitter replica."""

    concurrency: int = 32  # renders in flight at once (submitting, queued or rendering there)
    rate_per_s: float = 10.0  # submissions per second, on average
    burst: int = 10  # submissions allowed at once after a quiet spell


class RouteShare(msgspec.Struct, forbid_unknown_fields=True):
    model: str  # a real model, `<provider>/<name>`
    share: float  # relative weight


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    data_dir: str = "./.vidjobs"  # where the embedded stack keeps its state (servers, objects, secrets)
    database_url: str = ""  # empty: the embedded server under data_dir (started by `vidjobs up`)
    nats_url: str = ""  # empty: the embedded server under data_dir; a cluster's servers comma-separated
    storage_url: str = ""  # empty: file:// under data_dir
    http_port: int = 8080  # the gateway's port
    http_host: str = "127.0.0.1"  # the address the gateway listens on
    # The address providers and browsers reach the gateway at (callbacks, signed URLs).
    public_url: str = ""

    recovery_delay_s: float = 60.0  # the first recovery check of a job, this long after its creation
    recovery_interval_s: float = 60.0  # how often a non-terminal job is looked at again after that
    # A rendering job nobody has heard from is first looked at when its render should be done (its model's
    # median render here; `recovery_delay_s` while unmeasured), then again after half its silence past that
    # moment, at least `recovery_taper_min_s` and at most `recovery_interval_s` apart (a lost callback is found
    # soon after the render ends). Anything the provider says of a render unasked (a callback, a scheduled poll's
    # answer) leaves the check at the render's expected end where it is while that end is ahead (the last
    # callback may still be lost), and past it puts the next check `recovery_quiet_s` away: a provider that keeps
    # talking is not asked.
    recovery_taper_min_s: float = 10.0
    recovery_quiet_s: float = 120.0
    # At its deadline a render is asked about once more, and a finished one is downloaded; a provider that has
    # not answered that question `deadline_question_s` later has the render timed out without its answer.
    deadline_question_s: float = 30.0
    # How often the submitter looks once at each provider with a waiting job, handing out a slot that no event
    # announced (a lost wake-up, a breaker's pause running out). Waiting jobs cost nothing in between.
    queue_sweep_interval_s: float = 5.0
    # Estimated start and ready times of waiting jobs (vidjobs.common.estimates): a model's renders measured in
    # the last `estimate_window_s`, at most the last `estimate_samples` of them, and none shown with fewer than
    # `estimate_min_samples`; a provider's queue and a model's measurements are read at most once per
    # `estimate_refresh_s` per process, whoever asks (every read of a waiting job, every open event stream).
    estimate_window_s: float = 86400.0
    estimate_samples: int = 200
    estimate_min_samples: int = 5
    estimate_refresh_s: float = 3.0

    # A render's deadline, from its submission (vidjobs.common.render_deadlines): the p99 of how long its model's
    # renders held their provider slot, of those measured as for estimates (the last `estimate_window_s`, at
    # most `estimate_samples`), times 1 + `render_deadline_margin`, kept between the floor and the ceiling;
    # `render_deadline_s` while fewer than `render_deadline_min_samples` renders are measured. Per provider, as
    # JSON: {"runway": {"floor_s": 300, "ceiling_s": 3600, "margin": 1.0, "unmeasured_s": 1800}}
    render_deadline_s: float = 900.0
    render_deadline_floor_s: float = 120.0
    render_deadline_ceiling_s: float = 900.0  # above 20 min, raise VidjobsJobStuck's threshold with it
    render_deadline_margin: float = 0.5
    render_deadline_min_samples: int = 20
    render_deadlines: dict[str, DeadlinePolicy] = {}
    download_deadline_s: float = 300.0  # copying a finished render into storage, from the render's end
    download_attempts: int = 4  # deliveries of one download before the job fails with download_failed
    # A provider that sends nothing of a render for this long is given up on (that try of the download fails).
    download_stall_s: float = 30.0
    # The slowest average rate a download may keep (kilobytes of 1000 bytes a second): a render may take its
    # size at this rate to copy, even past download_deadline_s (the job's deadline then moves with it), so a
    # large render from a slow provider is not cut off, and a trickle is given up when that runs out.
    download_min_kb_per_s: float = 250.0
    max_attempts: int = 3  # attempts (renders asked for) per job before it fails
    # The backoff before a job's next attempt: exponential from base to cap, with full jitter.
    retry_base_s: float = 2.0
    retry_cap_s: float = 60.0
    # Per provider, as JSON: {"replicate": {"max_attempts": 5, "cap_s": 120, "retry_on_timeout": true}}
    retry_policies: dict[str, ProviderPolicy] = {}

    provider_timeout_s: float = 30.0  # one HTTP call to a provider
    # Connecting to a provider: a call that cannot connect this fast was never sent, so it is a clean failure
    # (tried again), not an unclear outcome; one sent and not answered runs into provider_timeout_s.
    provider_connect_timeout_s: float = 10.0
    # A submit no call of which got any answer (the provider stopped answering) keeps its attempt, and is asked
    # again under the same key, for this long from its first call; then a new attempt is made. As long as an
    # accepted render is waited for (the default render deadline): the provider may be rendering it.
    unclear_submit_limit_s: float = 900.0
    # Per provider, as JSON: {"runway": {"concurrency": 4, "rate_per_s": 1, "burst": 2}}
    provider_limits: dict[str, ProviderLimits] = {}

    breaker_threshold: int = 5  # provider_unavailable answers in a row that pause a provider (a refusal: at once)
    breaker_cooldown_s: float = 30.0  # first pause; doubles while probes keep failing (capped at 10 min)
    # Model aliases, as JSON: {"house/default": [{"model": "fake/default", "share": 95},
    #                                             {"model": "luma/ray-2", "share": 5}]}
    # The seed of the model routes table: an alias here that has no rows there is written there when a gateway
    # starts; after that the table decides (`vidjobs routes`, vidjobs.common.modelroutes). Shares are whole.
    model_routes: dict[str, list[RouteShare]] = {}
    # A gateway rereads the routes table at once when told of a change (LISTEN/NOTIFY), and this often anyway.
    routes_refresh_s: float = 5.0
    # A created job renders again what its account already had ready (it counts in
    # vidjobs_regenerations_total and in `vidjobs routes compare`'s regenerate rate) when it is a rerun, or has
    # the same model and normalised prompt as one of its jobs completed within this long before it.
    regeneration_window_s: float = 3600.0
    ack_wait_s: float = 30.0  # a consumer's message is redelivered if not acked (or heartbeated) this long
    max_deliveries: int = 10  # failed handlings of one message before it is dead-lettered
    # Server-side bounds on every database session of the services (see db.Timeouts).
    db_statement_timeout_s: float = 30.0
    db_lock_timeout_s: float = 10.0
    db_idle_in_transaction_timeout_s: float = 60.0
    # The client's own bound on one database call of an API request (waiting for a connection included): a
    # database that stops answering is met with 503 `unavailable` after this long, not a hung request. The
    # server cannot end a statement while it is stalled; the client gives up on it (vidjobs.common.dbcalls).
    db_call_timeout_s: float = 5.0
    # Connections each process's database pool holds at most; a call waits for a free one (under an API
    # request, within `db_call_timeout_s`). Lower it where many replicas share one PostgreSQL (deploy/CAPACITY.md).
    db_pool_size: Annotated[int, msgspec.Meta(ge=2, le=500)] = 10
    # NATS: the client pings its server this often and calls it gone after this many pings go unanswered,
    # then moves to another server of the cluster: a frozen server is noticed within (pings + 1) intervals.
    nats_ping_interval_s: float = 3.0
    nats_max_outstanding_pings: int = 2

    signing_secret: str = ""  # HMAC key for signed file URLs; `vidjobs up` generates one
    # The gateway's key for the webhook signing secrets it keeps in the database (vidjobs.gateway.sealing):
    # 32 random bytes, base64url; comma-separated while replacing it (the first seals, any opens). Only the
    # gateway is given it; `vidjobs up` generates one and keeps it in the data directory.
    secrets_key: str = ""

    signed_url_ttl_s: int = 900  # links to stored objects are short-lived; reading the job again renews them
    # The fake provider's adapters (`fake/*`, `fake-poll/*`): `on` for local development and tests (`vidjobs
    # up` turns it on); off otherwise, so a production deployment refuses fake models at create instead of
    # reserving credit for jobs no provider will render.
    fake_provider: Literal["on", "off"] = "off"
    fake_provider_url: str = "http://127.0.0.1:8090"
    fake_webhook_secret: str = ""  # Standard Webhooks `whsec_...` secret shared with the fake provider
    # The clips the fake provider renders unless a job's `params.clip` says: `tiny` (320 px, 12 fps, tens of
    # milliseconds to make: fast tests) or `real` (the requested resolution at 24 fps and a provider's
    # bitrate, seconds to make, kept on disk: production-sized media for benchmarks and demos). `vidjobs up`
    # makes it `real` unless this is set: the demo renders what was asked.
    fake_clip: Literal["tiny", "real"] = "tiny"
    # Where the fake provider keeps its real clips; empty: a directory of this user's under the system temp dir.
    fake_clip_dir: str = ""
    fake_clip_cache_mb: int = 2048  # the most its real clips take on disk; the clips used longest ago go first
    # Real providers: an adapter is offered when its API key is set or its name is in `providers`. Base URLs
    # are settings so tests (and regional endpoints) can point them elsewhere.
    # The real providers a deployment offers, comma-separated (`replicate,fal,runway,luma,veo`), named apart
    # from their keys so that a process that never calls a provider (the gateway: validation, models,
    # callbacks) is not given its key; the submitter and poller refuse to start without the keys of these.
    # Empty: the providers whose API key is set.
    providers: str = ""
    replicate_url: str = "https://api.replicate.com"
    replicate_api_token: str = ""
    replicate_webhook_secret: str = ""  # `whsec_...` from Replicate's secret endpoint (prefix and padding optional)
    fal_url: str = "https://queue.fal.run"
    fal_api_key: str = ""
    fal_jwks_url: str = "https://rest.alpha.fal.ai/.well-known/jwks.json"
    # Our fal user id: fal signs every customer's callbacks with the same keys, so a callback for another
    # fal user (sent to our URL) verifies; it is refused when its X-Fal-Webhook-User-Id is not this one.
    fal_user_id: str = ""
    # Runway, Luma and Veo: each one's base URL and API key.
    runway_url: str = "https://api.dev.runwayml.com"
    runway_api_key: str = ""
    luma_url: str = "https://api.lumalabs.ai"
    luma_api_key: str = ""
    veo_url: str = ""  # empty: the public endpoint of `veo_api`
    veo_api_key: str = ""  # a Vertex AI (express mode) key, or a Gemini API key with `veo_api` gemini
    # Veo is served by two Google APIs: `gemini` (the Gemini API, whose video route only its REST docs still
    # describe; the default, so a deployment's Gemini key keeps working across an upgrade) or `vertex` (Vertex AI
    # in express mode, the one Google's SDK builds Veo requests for: move to it with a Vertex key and
    # `veo_output_uri` once no Veo render is in flight, as each API polls only its own operations). On Vertex
    # AI, Veo writes each video to Cloud Storage under `veo_output_uri` (`gs://bucket/prefix/`; a process
    # refuses to start without it) and the media service fetches it from `veo_storage_url` with no credentials
    # (an API key does not open Cloud Storage), as it fetches other providers' CDN links: those objects must be
    # readable so, e.g. a bucket of their own with public read and a lifecycle rule deleting them after a day. On
    # the Gemini API a video is a file download fetched with the key (media holds `veo_api_key` either way, and
    # sends it there only).
    veo_api: Literal["vertex", "gemini"] = "gemini"
    veo_output_uri: str = ""
    veo_storage_url: str = "https://storage.googleapis.com"

    webhook_tolerance_s: int = 300  # a provider callback signed further than this from now is refused
    metrics_port: int = 0  # worker /healthz and /metrics; 0 picks a free port
    # The gateway's `/metrics` on the public API port (`on`), or (`off`) only on `metrics_port`, beside
    # /healthz and /readyz, where a network policy can keep it from the internet.
    api_metrics: Literal["on", "off"] = "on"

    stream_replicas: int = 1  # JetStream replicas per stream: 3 in production clusters
    submit_concurrency: int = 16  # messages a submitter process handles at once
    inbox_concurrency: int = 16  # stored provider callbacks a poller process handles at once
    poll_concurrency: int = 16  # status polls a poller process makes at once
    cancel_concurrency: int = 8  # renders a poller process asks their provider to stop at once
    download_concurrency: int = 4  # renders a media process copies at once
    media_concurrency: int = 2  # threads a media process verifies and transcodes with
    # A media process copying a render holds it this long past its last sign of life; a copier killed
    # mid-copy delays the next try of that render by at most this much.
    media_copy_lease_s: float = 60.0

    max_body_bytes: int = 64 * 1024  # a JSON body of an API request (413 past it)
    # API requests per API key: a token bucket refilled at this rate, holding at most `burst` requests. An
    # account's own `requests_per_s` / `request_burst` replace these.
    api_rate_per_s: float = 20.0
    api_rate_burst: int = 100
    # Requests per platform key (a product's backend managing its users' accounts, or acting for them), per
    # gateway process. A browser token spends at its account's API key rate, per process too.
    platform_rate_per_s: float = 50.0
    platform_rate_burst: int = 200
    # `Idempotency-Key`s are remembered this long; the gateway deletes older ones every sweep interval.
    idempotency_ttl_s: float = 86400.0
    idempotency_sweep_interval_s: float = 600.0
    # Caps on what one client may hold; each is shown in GET /v1/account `limits`. Streams are counted per
    # gateway process (what a stream costs is that process's pool and memory).
    # Event streams read the jobs they follow on a database pool of their own, this many connections per
    # gateway process, so they never queue for the connections API requests use; each job they follow is read
    # once per change per process, at most once per `stream_coalesce_s` while it churns.
    stream_db_pool_size: Annotated[int, msgspec.Meta(ge=1, le=100)] = 4
    stream_coalesce_s: Annotated[float, msgspec.Meta(ge=0.0, le=10.0)] = 0.25
    max_streams_per_account: int = 100  # open event streams
    max_streams_per_key: int = 50
    max_queued_jobs: int = 1000  # jobs of one account waiting for a slot
    max_uploads_per_day: int = 1000  # image uploads per account per UTC day
    # Provider callbacks: bodies up to this size (a real provider's callback can carry its logs and input);
    # stored callbacks per provider per gateway process, as a token bucket; stored rows kept this long.
    webhook_max_body_bytes: int = 4 * 1024 * 1024
    webhook_rate_per_s: float = 200.0
    webhook_rate_burst: int = 400
    webhook_retention_days: float = 7.0
    # What providers told the poller beside the inbox (status polls' answers, which job each stored callback
    # was about): rows kept per job, the oldest going first; they go after webhook_retention_days too.
    provider_answers_per_job: Annotated[int, msgspec.Meta(ge=1)] = 20

    max_download_bytes: int = 512 * 1024 * 1024  # the largest render copied into storage
    # Hosts whose render URLs may be fetched although they resolve to a private or loopback address, or are
    # plain http: `host` or `host:port`, comma-separated (a provider on our own network, the fake provider).
    download_allow_hosts: str = ""
    # Webhooks to accounts' apps: hosts they may be delivered to although private or plain http (local
    # development), the delay before each retry (the Standard Webhooks schedule, about a day in all), and how
    # long one delivery may take.
    webhook_allow_hosts: str = ""
    app_webhook_retry_s: str = "5,300,1800,7200,18000,36000,36000"
    app_webhook_timeout_s: float = 10.0
    # What one account's webhooks may cost (appwebhooks/claims.py): endpoints registered, attempts under way
    # at once and a minute (more wait their turn, nothing is dropped), manual retries of one delivery; and
    # attempts at once to one host (host:port), whoever's. Delivery history is kept this long once finished.
    max_webhook_endpoints: int = 20
    webhook_deliveries_in_flight: int = 16
    webhook_deliveries_per_minute: int = 600
    max_webhook_manual_retries: int = 5
    webhook_host_in_flight: int = 4
    webhook_delivery_retention_days: float = 7.0
    # Looking up a name for an untrusted URL (webhook endpoints, render downloads): its own few threads, so
    # a resolver that never answers cannot take the ones image decoding uses, and a time limit.
    dns_timeout_s: float = 5.0
    dns_threads: int = 4

    s3_part_bytes: int = 8 * 1024 * 1024  # multipart upload part size for the S3 backend (at least 5 MiB)
    # The object store (S3 backend): a request that cannot connect, or hears nothing back, for this long is
    # abandoned (its connection closed, never reused) and tried again, `storage_attempts` tries in all; then
    # the store counts as unavailable: a worker defers its work, the gateway answers 503, /readyz says so.
    storage_timeout_s: float = 3.0
    storage_attempts: int = 2
    # Every stored object is read back (its size and SHA-256, as the store reports them) and stored again
    # while it differs from what was sent, this many stores in all; then media counts a failed download (its
    # retries copy the render again) and the gateway answers 503.
    store_verify_attempts: int = 3
    # Image uploads (image-to-video input).
    upload_max_bytes: int = 10 * 1024 * 1024
    upload_max_side: int = 8192  # pixels, either side
    upload_max_pixels: int = 40_000_000  # width x height, checked from the header before decoding
    # The media worker decodes this many uploads at once per process (each may hold a few hundred MB at the
    # pixel limit). An upload still processing this long after it was made (its message lost, or the media
    # service down all that time) is rejected by the reaper as `image_unprocessed`.
    upload_decode_slots: int = 2
    upload_processing_deadline_s: float = 21600.0
    # Derived assets.
    preview_seconds: float = 3.0  # length of the low-resolution preview clip
    preview_max_side: int = 320  # its longer side, in pixels
    # Retention: originals are removed this long after the job completed (the job becomes `expired`);
    # thumbnails stay while the job exists.
    retention_days: float = 30.0
    retention_sweep_interval_s: float = 300.0  # how often the reaper looks for jobs past retention
    # An account's app hears `job.expiring` this long before retention removes a clip (at most the retention
    # itself), once per window; a clip is never removed sooner than this after its warning. 0: no warnings.
    expiry_warning_days: float = 3.0
    # What an account's kept clips (POST /v1/jobs/{id}/keep) may hold in all, unless the account has its own.
    storage_quota_bytes: int = 10 * 1024**3
    # Exports of a clip to an account's own bucket: hosts a presigned URL may name although private or plain
    # http (local development, a test's S3 server), tries of one export before it fails, and exports of one
    # account under way at once (more are refused with 429 until one ends).
    export_allow_hosts: str = ""
    export_attempts: int = 4
    max_exports_in_flight: int = 10
    orphan_sweep_interval_s: float = 3600.0  # how often media looks for stored objects no job owns
    orphan_grace_s: float = 3600.0  # objects younger than this are never called orphans (a copy may be running)

    log_level: str = "INFO"  # DEBUG, INFO, WARNING or ERROR
    log_format: Literal["json", "text"] = "json"  # json or text (`vidjobs up` uses text)
    demo_credits: int = 100_000  # the credit of the demo account `vidjobs up` creates on first start

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).resolve()

    @property
    def gateway_url(self) -> str:
        return self.public_url or f"http://{self.http_host}:{self.http_port}"

    def limits_for(self, provider: str) -> ProviderLimits:
        """How hard `provider` may be pushed: its entry in `provider_limits`, else the defaults."""
        return self.provider_limits.get(provider, ProviderLimits())

    def allowed_webhook_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.webhook_allow_hosts.split(",") if h.strip())

    def app_webhook_retries(self) -> list[float]:
        """Seconds before each retry after the first attempt; as many retries as there are entries."""
        return [float(part) for part in self.app_webhook_retry_s.split(",") if part.strip()]

    def allowed_export_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.export_allow_hosts.split(",") if h.strip())

    def allowed_download_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.download_allow_hosts.split(",") if h.strip())

    def storage_location(self) -> str:
        return self.storage_url or f"file://{self.data_path / 'objects'}"

    def upload_limits(self) -> Limits:
        return Limits(max_side=self.upload_max_side, max_pixels=self.upload_max_pixels)

    def with_(self, **changes: Any) -> Settings:
        return msgspec.structs.replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The environment that reproduces these settings in a child process."""
        env = {}
        for field in msgspec.structs.fields(self):
            value = getattr(self, field.name)
            text = msgspec.json.encode(value).decode() if field.name in _JSON_FIELDS else str(value)
            env[PREFIX + field.name.upper()] = text
        return env


def load(environ: Mapping[str, str] | None = None) -> Settings:
    source: Mapping[str, str] = os.environ if environ is None else environ
    raw = {
        key[len(PREFIX) :].lower(): value
        for key, value in source.items()
        if key.startswith(PREFIX) and key not in _NOT_SETTINGS
    }
    for name in _JSON_FIELDS & raw.keys():
        try:
            raw[name] = msgspec.json.decode(raw[name])
        except msgspec.DecodeError as exc:
            raise ConfigError(f"bad setting: {PREFIX}{name.upper()} is not JSON: {exc}") from exc
    try:
        return msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"bad setting: {_env_name(str(exc))}") from exc


def _env_name(message: str) -> str:
    # msgspec says "... - at `$.http_port`"; name the variable a person actually sets.
    if message.startswith("Object contains unknown field `"):
        name = message.split("`")[1]
        return f"unknown setting {PREFIX}{name.upper()} (docs/SETTINGS.md lists every setting)"
    if "`$." in message:
        head, _, tail = message.partition("`$.")
        name, _, rest = tail.partition("`")
        return f"{head}{PREFIX}{name.upper()}{rest}"
    return message
