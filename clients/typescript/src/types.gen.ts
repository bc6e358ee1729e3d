// Generated from the gateway's OpenAPI document by scripts/gen_types.py: do not edit by hand.
// Regenerate with `python clients/typescript/scripts/gen_types.py`; a test fails when this file and the
// document differ.

/** Answer of `GET /v1/account`. */
export interface AccountOut {
  /** acct_... */
  id: string;
  /** the account's name */
  name: string;
  /** balance, reserved and available */
  credits: Credits;
  /** the limits in force */
  limits: Limits;
  /** credits committed today (UTC), as the daily cap counts them */
  spent_today: number;
  /** jobs not finished yet, waiting ones included */
  active_jobs: number;
  /** of those, waiting for a slot */
  queued_jobs: number;
  /** image uploads made today (UTC), as the daily cap counts them */
  uploads_today: number;
  /** the default for a job that names none (PATCH /v1/account) */
  fallback_models: string[];
  /** what kept clips hold, and the most they may */
  storage: StorageOut;
}

/** Body of `PATCH /v1/account`: the settings an account keeps for itself; unset fields stay as they are. */
export interface AccountPatch {
  /** the default for a job that names none; [] for none */
  fallback_models?: string[] | null;
}

export interface AttemptOut {
  /** when it was sent */
  at: string;
  /** the HTTP status your endpoint answered; null when it did not answer */
  status: number | null;
  /** what went wrong when no answer came */
  error: string | null;
  /** how long the attempt took */
  ms: number;
}

export interface AuditEntryOut {
  /** its place in the trail */
  id: number;
  /** when it was answered */
  at: string;
  /** who */
  platform_key_id: string;
  /** what: the route's name (e.g. `create_platform_account`, or an account route acted for) */
  action: string;
  /** the account it concerned, if any */
  account_id: string | null;
  /** the path it was asked on */
  target: string;
  /** how it was answered */
  status: number;
  /** the request's X-Request-Id */
  request_id: string;
}

export interface AuditPage {
  /** newest first */
  data: AuditEntryOut[];
  /** pass as `cursor` for the next page; null on the last */
  next_cursor: string | null;
}

export interface AuditQuery {
  /** only the lines about this account */
  account_id?: string | null;
  /**
   * lines per page, 1-100
   * @default 50
   */
  limit?: number;
  /** next_cursor of the previous page */
  cursor?: string | null;
}

export interface Cost {
  /** reserved when the job was created, and the most it can cost */
  estimated_credits: number;
  /** charged when it ended; null until then */
  actual_credits: number | null;
  /** what the provider billed for all its attempts, in credits; null: not known yet */
  provider_credits: number | null;
  /** once it ended: what of provider_credits the platform paid, not you; else null */
  absorbed_credits: number | null;
}

/** Body of `POST /v1/jobs`. */
export interface CreateJob {
  /** `<provider>/<model name>` */
  model: string;
  /** what to render */
  prompt: string;
  /**
   * seconds of video, 1-60 (a model may round up to a length it makes)
   * @default 5
   */
  duration_s?: number;
  /**
   * 16:9, 9:16 or 1:1
   * @default "16:9"
   */
  aspect_ratio?: "16:9" | "1:1" | "9:16";
  /**
   * 480p, 720p or 1080p
   * @default "720p"
   */
  resolution?: "1080p" | "480p" | "720p";
  /** the same seed and request render alike, where the model takes one */
  seed?: number | null;
  /** what not to render, where the model takes one */
  negative_prompt?: string | null;
  /** an upload id (POST /v1/uploads): render from this first frame */
  input_image?: string | null;
  /** the provider's own extras, checked by its adapter */
  params?: Record<string, unknown>;
  /** your own labels: up to 16 keys of 1-40 letters, digits, `_`, `.` or `-`, each a string of at most 256 characters; returned with the job and filterable in GET /v1/jobs */
  metadata?: Record<string, string>;
  /** an URL of your app that hears of this job, signed with your webhook secret (POST /v1/account/webhook-secret) */
  webhook_url?: string | null;
  /** which events go to webhook_url; default job.completed, job.failed, job.canceled */
  webhook_events?: ("job.canceled" | "job.completed" | "job.expiring" | "job.failed" | "job.moved" | "job.retrying" | "job.stage")[] | null;
  /** where it may move while it waits, up to 3; unset: the account's default list (GET /v1/account); []: none */
  fallback_models?: string[] | null;
  /** the longest it should wait for a slot: past it (by the estimate), it moves to a fallback that starts sooner */
  max_wait_s?: number | null;
  /**
   * default interactive; batch starts after your waiting interactive jobs (other accounts' turns are unchanged)
   * @default "interactive"
   */
  priority?: "batch" | "interactive";
}

/** Body of `POST /v1/platform/accounts`. Made again with the same external_id, the account made first is
answered (200) and nothing changes. */
export interface CreatePlatformAccount {
  /** renders in flight at once */
  concurrent_jobs?: number;
  /** jobs waiting for a slot; null: the platform default */
  max_queued_jobs?: number | null;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap?: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits?: number | null;
  /** API requests per second per key; null: the platform default */
  requests_per_s?: number | null;
  /** requests at once after a quiet spell; null: the platform default */
  request_burst?: number | null;
  /** what kept clips may hold; null: the default */
  storage_quota_bytes?: number | null;
  /** models to move to, in order, while the job waits: when its provider is unavailable, or its estimated start is later than max_wait_s; each must render this request at no more than its quote */
  fallback_models?: string[];
  /** your own id of the user (1-256 printable ASCII characters, no spaces); unique per platform */
  external_id: string;
  /**
   * a name to show; the external_id when left out
   * @default ""
   */
  name?: string;
  /** a plan's limits; limits given beside it override them */
  plan?: string | null;
}

/** Body of `POST /v1/platform/accounts/{account_id}/credits`. */
export interface CreditChange {
  /** grant adds credit; take_back removes unreserved credit */
  action: "grant" | "take_back";
  /** credits, a whole number */
  amount: number;
  /** your billing provider's event id: the same key is one change */
  idempotency_key: string;
  /**
   * kept in the ledger entry's note
   * @default ""
   */
  reason?: string;
}

export interface CreditChangeOut {
  /** the ledger entry of the change */
  entry: LedgerEntryOut;
  /** true: an earlier call with this idempotency key made it; nothing changed now */
  replayed: boolean;
  /** the account's credit now */
  credits: Credits;
}

export interface Credits {
  /** credits the account holds */
  balance: number;
  /** held for jobs that have not finished */
  reserved: number;
  /** balance - reserved: what new jobs may use */
  available: number;
}

export interface DeletedAccountOut {
  /** the account */
  id: string;
  /** deleting: its jobs are ending and its data being removed */
  status: "deleted" | "deleting";
  /** live jobs this call canceled */
  jobs_canceled: string[];
  /** API keys this call revoked */
  keys_revoked: number;
}

export interface DeliveryList {
  /** newest first */
  data: DeliveryOut[];
  /** pass as `cursor` for the next page; null on the last */
  next_cursor?: string | null;
}

export interface DeliveryOut {
  /** its webhook-id header: the same on every attempt */
  id: string;
  /** the job it tells of */
  job_id: string;
  /** job.completed, job.failed, job.canceled, job.stage, job.moved, job.retrying or job.expiring */
  event_type: string;
  /** pending (more attempts to come), delivered, failed (schedule used up) or disabled (410) */
  status: "delivered" | "disabled" | "failed" | "pending";
  /** when it is tried next, while pending */
  next_attempt_at: string | null;
  /** when the move happened */
  created_at: string;
  /** attempts made so far */
  attempt_count: number;
  /** the last ten attempts, oldest first */
  attempts: AttemptOut[];
}

/** Query string of `GET /v1/webhook-endpoints/{endpoint_id}/deliveries`. */
export interface DeliveryQuery {
  /**
   * deliveries per page, 1-100
   * @default 20
   */
  limit?: number;
  /** next_cursor of the previous page */
  cursor?: string | null;
}

/** Body of `POST /v1/platform/accounts/{account_id}/disable`. Waiting jobs are canceled and their credit
released either way; running ones finish (`finish`) or are stopped (`stop`). */
export interface DisableAccount {
  /**
   * its running jobs: finish them, or stop them
   * @default "finish"
   */
  running?: "finish" | "stop";
  /**
   * why, for the canceled jobs' trail
   * @default ""
   */
  reason?: string;
}

export interface DisabledOut {
  /** the account as it is now */
  account: PlatformAccountOut;
  /** jobs this call canceled */
  jobs_canceled: string[];
}

export interface EndpointCreated {
  /** whe_... */
  id: string;
  /** where deliveries go */
  url: string;
  /** which events it hears */
  events: string[];
  /** your own note */
  description: string;
  /** when it was registered */
  created_at: string;
  /** it answered 410 Gone; nothing more is sent to it */
  disabled_at: string | null;
  /** why it was disabled */
  disabled_reason: string | null;
  /** when its secret was made: at registration, or by its last rotation */
  secret_created_at: string;
  /** until then deliveries are signed with the secret its last rotation replaced too; null: only the current */
  previous_secret_expires_at: string | null;
  /** whsec_...: verifies its deliveries (Standard Webhooks); shown this once */
  secret: string;
}

/** Body of `POST /v1/webhook-endpoints`. */
export interface EndpointIn {
  /** an https URL of your app */
  url: string;
  /** which events it hears; default all seven */
  events?: ("job.canceled" | "job.completed" | "job.expiring" | "job.failed" | "job.moved" | "job.retrying" | "job.stage")[];
  /**
   * your own note
   * @default ""
   */
  description?: string;
}

export interface EndpointList {
  /** oldest first */
  data: EndpointOut[];
}

export interface EndpointOut {
  /** whe_... */
  id: string;
  /** where deliveries go */
  url: string;
  /** which events it hears */
  events: string[];
  /** your own note */
  description: string;
  /** when it was registered */
  created_at: string;
  /** it answered 410 Gone; nothing more is sent to it */
  disabled_at: string | null;
  /** why it was disabled */
  disabled_reason: string | null;
  /** when its secret was made: at registration, or by its last rotation */
  secret_created_at: string;
  /** until then deliveries are signed with the secret its last rotation replaced too; null: only the current */
  previous_secret_expires_at: string | null;
}

export interface ErrorBody {
  /** what kind of error: one of a small, fixed set */
  code: "account_disabled" | "canceled" | "conflict" | "content_rejected" | "download_failed" | "forbidden" | "internal" | "invalid_input" | "limit_reached" | "method_not_allowed" | "not_found" | "not_ready" | "payload_too_large" | "provider_misconfigured" | "provider_unavailable" | "quota_exhausted" | "rate_limited" | "render_timeout" | "storage_quota_exceeded" | "timeout" | "unauthorized" | "unavailable" | "unsupported_media_type" | "upload_not_ready" | "upload_rejected" | "verification_failed";
  /** what went wrong and what to do, naming the field at fault */
  message: string;
  /** whether the same request may succeed later (after Retry-After, if given) */
  retryable: boolean;
  /** the X-Request-Id of the request, to quote when asking about it */
  request_id?: string | null;
}

export type ErrorCode = "canceled" | "content_rejected" | "download_failed" | "internal" | "invalid_input" | "provider_misconfigured" | "provider_unavailable" | "quota_exhausted" | "rate_limited" | "render_timeout" | "timeout" | "verification_failed";

export interface ErrorOut {
  /** every error answer has this one shape */
  error: ErrorBody;
}

/** What `POST /v1/jobs` with this body would reserve, without creating anything. */
export interface EstimateOut {
  /** the model it would render with (an alias resolved, as a create by this account would now) */
  model: string;
  /** what a create would reserve */
  estimated_credits: number;
  /** the price */
  credits_per_second: number;
  /** the card the price comes from */
  rate_card_version: number;
  /** the account's balance less what running jobs have reserved */
  available_credits: number;
  /** whether a create would be accepted as far as credit goes (daily caps aside) */
  affordable: boolean;
}

/** Body of `POST /v1/jobs/{job_id}/export`. */
export interface ExportIn {
  /** a presigned PUT URL of your own bucket, https, at most 4096 characters */
  url: string;
}

export interface ExportList {
  /** newest first, the last 20 */
  data: ExportOut[];
}

/** An export of a job's stored original to a URL of yours. */
export interface ExportOut {
  /** exp_... */
  id: string;
  /** the job whose clip it copies */
  job_id: string;
  /** where it goes (the URL itself is a credential of yours and is not shown) */
  host: string;
  /** pending until the copy is stored there, or given up */
  status: "done" | "failed" | "pending";
  /** failed: why; pending: what the last try met, when one failed (it is tried again) */
  reason: string | null;
  /** tries that failed so far */
  attempts: number;
  /** sent, once done */
  bytes: number | null;
  /** when it was asked for */
  created_at: string;
  /** when it was done or given up */
  finished_at: string | null;
}

export interface Format {
  /** 16:9, 9:16 or 1:1 */
  aspect_ratio: string;
  /** 480p, 720p or 1080p */
  resolution: string;
  /** the lengths it renders in this format, where fewer than the model's */
  durations_s?: number[] | null;
}

export interface Health {
  /** ok, or why not */
  status: string;
}

/** The `error` object of a job, as stored and as shown. */
export interface JobError {
  /** what kind of failure: one of a small, fixed set */
  code: ErrorCode;
  /** what happened and what to do, in words */
  message: string;
  /** whether the same request may succeed later */
  retryable: boolean;
}

export interface JobList {
  /** newest first */
  data: JobOut[];
  /** pass as `cursor` for the next page; null on the last */
  next_cursor: string | null;
  /** whether another page follows (then `next_cursor` fetches it) */
  has_more: boolean;
}

/** A job as every read shows it: where it stands, what was asked for, and when things happened. */
export interface JobOut {
  /** job_... */
  id: string;
  /** where it is in its lifecycle */
  status: JobStatus;
  /** only moves forward: queued, submitted, rendering, downloading, ready; or failed, canceled, expired */
  stage: Stage;
  /** the model it renders with (an alias resolved) */
  model: string;
  /** as asked */
  prompt: string;
  /** when it was created */
  created_at: string;
  /** when anything about it last changed */
  updated_at: string;
  /** which render attempt (a transient failure is retried as a new one) */
  attempt: number;
  /** once retried: what ended the last try, and how many attempts it may have; else null */
  retry: RetryOut | null;
  /** its place among the account's waiting jobs while it waits (interactive before batch), or in the provider's queue */
  queue_position: number | null;
  /** why a queued job is not submitted yet (a paused or busy provider) */
  queue_reason: string | null;
  /** its lane: the account's waiting interactive jobs are numbered and started before batch ones */
  priority: "batch" | "interactive";
  /** while it waits (pending): when it is likely to start and be ready; else null */
  estimate: QueueEstimate | null;
  /** while at its provider (submitted, processing): when it is likely ready; else null */
  ready: ReadyEstimate | null;
  /** the provider's own progress figure, 0-1, where it gives one */
  progress: number | null;
  /** why it failed; null unless it did */
  error: JobError | null;
  /** the stored render; null until it is ready */
  outputs: JobOutputs | null;
  /** credits reserved and charged */
  cost: Cost;
  /** as asked */
  duration_s: number;
  /** as asked */
  aspect_ratio: string;
  /** as asked */
  resolution: string;
  /** as asked */
  seed: number | null;
  /** as asked */
  negative_prompt: string | null;
  /** as asked */
  input_image: string | null;
  /** as asked */
  params: Record<string, unknown>;
  /** your labels, as given */
  metadata: Record<string, string>;
  /** where it may still move while it waits, in order (its trail says where it moved) */
  fallback_models: string[];
  /** its limit on waiting for a slot, as asked */
  max_wait_s: number | null;
  /** when the provider accepted its current attempt */
  started_at: string | null;
  /** when it reached its ending: completed, failed or canceled */
  completed_at: string | null;
  /** when its current stage gives up (a render's: from its model's measured renders) */
  deadline_at: string | null;
  /** while retrying: when the next attempt is queued */
  retry_at: string | null;
  /** the job it renders again (POST /v1/jobs/{id}/rerun); null for any other job */
  rerun_of: string | null;
  /** where to read, cancel and follow it */
  urls: JobUrls;
}

export interface JobOutputs {
  /** null once the job expired: the original was removed */
  video_url: string | null;
  /** a JPEG poster frame; signed and expiring */
  thumbnail_url: string;
  /** a short low-resolution clip of its start; null once expired */
  preview_url: string | null;
  /** when these links stop working; read the job again for fresh ones */
  expires_at: string;
  /** when the original is removed (the job becomes `expired`; warned `job.expiring` before); null while kept */
  retained_until: string | null;
  /** kept past retention (POST /v1/jobs/{id}/keep) until released (DELETE /v1/jobs/{id}/keep) */
  kept: boolean;
  /** of the stored video */
  duration_s: number;
  /** of the stored video, in pixels */
  width: number;
  /** of the stored video, in pixels */
  height: number;
  /** of the stored video */
  bytes: number;
  /** of the stored video, hex */
  sha256: string;
  /** pixels */
  thumbnail_width: number | null;
  /** pixels */
  thumbnail_height: number | null;
  /** pixels */
  preview_width: number | null;
  /** pixels */
  preview_height: number | null;
  /** seconds of the low-resolution preview clip */
  preview_duration_s: number | null;
}

export type JobStatus = "canceled" | "completed" | "downloading" | "expired" | "failed" | "pending" | "processing" | "retrying" | "submitted";

/** Where to read, cancel and follow the job. */
export interface JobUrls {
  /** this job */
  get: string;
  /** POST here to cancel it */
  cancel: string;
  /** its Server-Sent Events */
  stream: string;
}

export interface KeyList {
  /** the account's keys, oldest first */
  data: KeyOut[];
}

export interface KeyOut {
  /** the key's id, to revoke it */
  id: string;
  /** its name */
  name: string;
  /** the key's first characters, enough to recognise it */
  prefix: string;
  /** when it was made */
  created_at: string;
  /** when it was last used; null: never */
  last_used_at: string | null;
  /** when it was revoked; null: live */
  revoked_at: string | null;
}

/** One change of the account's balance or reservation, and what it left. */
export interface LedgerEntryOut {
  /** its place in the ledger */
  id: number;
  /** what changed the balance or reservation */
  kind: LedgerKind;
  /** the job it concerns, if any */
  job_id: string | null;
  /** credits */
  balance_change: number;
  /** credits */
  reserved_change: number;
  /** credits */
  balance_after: number;
  /** credits */
  reserved_after: number;
  /** why, in words */
  note: string;
  /** when */
  at: string;
  /** credits the provider billed beyond the job's charge, paid by the platform (absorb entries) */
  absorbed: number;
}

export type LedgerKind = "absorb" | "charge" | "grant" | "opening" | "release" | "reprice" | "reserve";

export interface LedgerPage {
  /** newest first */
  data: LedgerEntryOut[];
  /** pass as `cursor` for the next page; null on the last */
  next_cursor: string | null;
}

/** Query string of `GET /v1/account/ledger`. */
export interface LedgerQuery {
  /**
   * entries per page, 1-100
   * @default 20
   */
  limit?: number;
  /** next_cursor of the previous page */
  cursor?: string | null;
}

/** The limits in force: the account's own, or the platform's where it has none. */
export interface Limits {
  /** renders at once; more jobs wait in the account's queue */
  concurrent_jobs: number;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits: number | null;
  /** API requests per second, per API key */
  requests_per_s: number;
  /** requests one key may make at once after a quiet spell */
  request_burst: number;
  /** jobs that may wait for a slot at once; creating more answers 429 */
  max_queued_jobs: number;
  /** event streams open at once (per gateway replica) */
  max_open_streams: number;
  /** event streams open at once per API key (per gateway replica) */
  max_open_streams_per_key: number;
  /** image uploads per UTC day, deleted ones included */
  max_uploads_per_day: number;
  /** a JSON request body */
  max_body_bytes: number;
  /** an uploaded image */
  max_upload_bytes: number;
  /** webhook endpoints registered at once */
  max_webhook_endpoints: number;
  /** webhook attempts under way at once; more wait their turn */
  webhook_deliveries_in_flight: number;
  /** webhook attempts a minute; more wait their turn */
  webhook_deliveries_per_minute: number;
  /** times one delivery may be sent again by hand */
  max_webhook_manual_retries: number;
  /** exports pending at once (POST /v1/jobs/{id}/export); more answer 429 */
  max_exports_in_flight: number;
}

/** Query string of `GET /v1/jobs`. Besides these, `metadata.<key>=<value>` keeps the jobs whose metadata
has that key with that value (several: all of them). */
export interface ListQuery {
  /** one status or several, comma-separated */
  status?: string | null;
  /** only jobs of this model */
  model?: string | null;
  /** jobs created at or after this time */
  created_after?: string | null;
  /** jobs created before this time */
  created_before?: string | null;
  /**
   * jobs per page, 1-100
   * @default 20
   */
  limit?: number;
  /** next_cursor of the previous page */
  cursor?: string | null;
}

export interface ModelList {
  /** every model, by provider */
  data: ModelOut[];
  /** the card the prices come from */
  rate_card_version: number;
}

/** A model this deployment renders with: what it takes, and its price by resolution. */
export interface ModelOut {
  /** what a job's `model` names */
  id: string;
  /** the provider it renders at */
  provider: string;
  /** model aliases that send some of their accounts here (rollout routing) */
  aliases: string[];
  /** the clip lengths it renders */
  durations_s: number[];
  /** a length under the longest that is not listed is rendered as the next one listed */
  rounds_up: boolean;
  /** the (aspect ratio, resolution) pairs it renders */
  formats: Format[];
  /** the pairs it renders from an input image, where they differ */
  formats_with_image: Format[] | null;
  /** none | optional | required */
  input_image: string;
  /** whether it takes one */
  negative_prompt: boolean;
  /** whether it takes one */
  seed: boolean;
  /** resolution -> price on the current rate card (null: unpriced) */
  credits_per_second: Record<string, number | null>;
}

export interface NewKey {
  /**
   * a name to recognise the key by
   * @default ""
   */
  name?: string;
}

export interface NewKeyOut {
  /** the key's id, to revoke it */
  id: string;
  /** its name */
  name: string;
  /** the key's first characters, enough to recognise it */
  prefix: string;
  /** when it was made */
  created_at: string;
  /** when it was last used; null: never */
  last_used_at: string | null;
  /** when it was revoked; null: live */
  revoked_at: string | null;
  /** shown once; stored only hashed */
  key: string;
}

/** Body of `POST /v1/account/tokens` and `POST /v1/platform/accounts/{account_id}/tokens`. */
export interface NewToken {
  /** what the token may do: read, create, upload (at least one) */
  scopes?: TokenScope[];
  /** only these jobs (and those it creates); left out: every job of the account */
  jobs?: string[] | null;
  /**
   * seconds it lives, 60-3600
   * @default 900
   */
  ttl_s?: number;
  /** with `create`: what its jobs may reserve together, in credits; null: only the account's own limits */
  credit_ceiling?: number | null;
}

/** Body of `PATCH /v1/platform/accounts/{account_id}`. A plan sets every limit it carries; a limit given
here (with or without a plan) is the account's own and takes it off its plan. */
export interface PatchPlatformAccount {
  /** renders in flight at once */
  concurrent_jobs?: number;
  /** jobs waiting for a slot; null: the platform default */
  max_queued_jobs?: number | null;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap?: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits?: number | null;
  /** API requests per second per key; null: the platform default */
  requests_per_s?: number | null;
  /** requests at once after a quiet spell; null: the platform default */
  request_burst?: number | null;
  /** what kept clips may hold; null: the default */
  storage_quota_bytes?: number | null;
  /** models to move to, in order, while the job waits: when its provider is unavailable, or its estimated start is later than max_wait_s; each must render this request at no more than its quote */
  fallback_models?: string[];
  /** a new name to show */
  name?: string;
  /** 1-40 of a-z, 0-9, `_`, `-` */
  plan?: string;
}

/** Body of `PUT /v1/platform/plans/{plan}`: every account on the plan takes these limits at once. */
export interface Plan {
  /**
   * renders in flight at once
   * @default 2
   */
  concurrent_jobs?: number;
  /** jobs waiting for a slot; null: the platform default */
  max_queued_jobs?: number | null;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap?: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits?: number | null;
  /**
   * models to move to, in order, while the job waits: when its provider is unavailable, or its estimated start is later than max_wait_s; each must render this request at no more than its quote
   * @default []
   */
  fallback_models?: string[];
}

export interface PlanList {
  /** the platform's plans, by name */
  data: PlanOut[];
}

export interface PlanOut {
  /**
   * renders in flight at once
   * @default 2
   */
  concurrent_jobs?: number;
  /** jobs waiting for a slot; null: the platform default */
  max_queued_jobs?: number | null;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap?: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits?: number | null;
  /**
   * models to move to, in order, while the job waits: when its provider is unavailable, or its estimated start is later than max_wait_s; each must render this request at no more than its quote
   * @default []
   */
  fallback_models?: string[];
  /** the plan's name */
  name: string;
  /** accounts on it */
  accounts: number;
  /** when its limits last changed */
  updated_at: string;
}

export interface PlatformAccountOut {
  /** the account's id: name it in paths and in Vidjobs-Account */
  id: string;
  /** null for an account the operator made */
  external_id: string | null;
  /** its name */
  name: string;
  /** null: limits of its own */
  plan: string | null;
  /** active, or disabled (it may read, not create) */
  status: "active" | "disabled";
  /** when it was disabled; null while active */
  disabled_at: string | null;
  /** when it was made */
  created_at: string;
  /** its credit now */
  credits: Credits;
  /** its own limits (null: the platform default) */
  limits: PlatformLimitsOut;
  /** default fallbacks of its jobs that name none */
  fallback_models: string[];
}

export interface PlatformAccountPage {
  /** oldest first */
  data: PlatformAccountOut[];
  /** pass as `cursor` for the next page; null on the last */
  next_cursor: string | null;
}

export interface PlatformAccountsQuery {
  /** only the account of this user */
  external_id?: string | null;
  /**
   * accounts per page, 1-100
   * @default 20
   */
  limit?: number;
  /** next_cursor of the previous page */
  cursor?: string | null;
}

export interface PlatformLimitsOut {
  /** renders in flight at once */
  concurrent_jobs: number;
  /** null: the platform default */
  max_queued_jobs: number | null;
  /** credits committed per UTC day; null: no cap */
  daily_spend_cap: number | null;
  /** the most one job may be estimated at; null: no maximum */
  max_job_credits: number | null;
  /** null: the platform default */
  requests_per_s: number | null;
  /** null: the platform default */
  request_burst: number | null;
  /** what kept clips may hold; null: the platform default */
  storage_quota_bytes: number | null;
}

/** `GET /v1/platform`: who the key is. */
export interface PlatformOut {
  /** the platform's id */
  platform_id: string;
  /** the platform's name, as the operator made it */
  platform: string;
  /** this key's id, as the audit trail names it */
  key_id: string;
  /** what this key may do */
  scopes: string[];
}

/** When a waiting job is likely to start and be ready: a range from the typical case (p50) to a late one
(p90), made from the renders of its model this deployment measured and its provider's queue as it stands.
The times are null when there is no estimate (too few renders measured yet, submissions paused, the
provider unavailable): `unavailable` names why, `note` says it in words. */
export interface QueueEstimate {
  /** jobs likely to start before it at its provider, every account's */
  jobs_ahead: number;
  /** as many as may start before it in the late case */
  jobs_ahead_p90: number;
  /** likely start; a moment in the past means any moment now */
  start_p50: string | null;
  /** late start */
  start_p90: string | null;
  /** likely ready */
  ready_p50: string | null;
  /** late ready */
  ready_p90: string | null;
  /** why there are no times: too_few_renders, submissions_paused or provider_unavailable; null when there are */
  unavailable: "provider_unavailable" | "submissions_paused" | "too_few_renders" | null;
  /** in words: what the times rest on, or why there are none */
  note: string;
}

/** When a job at its provider (submitted or processing) is likely to be ready: its start plus how long its
model's renders measured here took from start to ready, from the typical case (p50) to a late one (p90).
The times are null when there is no range (too few renders measured yet, or it has passed the late end
already): `unavailable` names why, `note` says it in words. `deadline_at` is when it is stopped. */
export interface ReadyEstimate {
  /** likely ready; a moment in the past means any moment now */
  ready_p50: string | null;
  /** late ready */
  ready_p90: string | null;
  /** why there are no times; null when there are */
  unavailable: "overdue" | "too_few_renders" | null;
  /** in words: what the times rest on, or why there are none */
  note: string;
}

/** Why a job was sent round again: what ended its last try (while `retrying`, the attempt it shows; then
the try before the one at hand; a rate limit waits without spending an attempt). Its stage stays where it
had got to. */
export interface RetryOut {
  /** what ended the last try: rate_limited, provider_unavailable, timeout, ... */
  code: ErrorCode;
  /** what happened, in words */
  message: string;
  /** the most attempts it may have */
  max_attempts: number;
}

/** Body of `POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret` and `POST /v1/account/webhook-secret`. */
export interface RotateSecretIn {
  /**
   * seconds the replaced secret keeps signing beside the new one: 0 (not at all) to 604800 (7 days); default a day
   * @default 86400
   */
  overlap_s?: number;
}

export interface SecretIssued {
  /** whsec_...: verifies deliveries from now on (Standard Webhooks); shown this once */
  secret: string;
  /** when it was made */
  created_at: string;
  /** until then deliveries are signed with the secret it replaced too (two `v1,` signatures); null: not at all */
  previous_secret_expires_at: string | null;
}

export type Stage = "canceled" | "downloading" | "expired" | "failed" | "queued" | "ready" | "rendering" | "submitted";

/** What the account's kept clips hold (POST /v1/jobs/{id}/keep), against its storage quota. */
export interface StorageOut {
  /** the stored videos of its kept jobs */
  used_bytes: number;
  /** the most they may hold; a keep that would pass it answers 409 storage_quota_exceeded */
  limit_bytes: number;
  /** jobs kept past retention */
  kept_jobs: number;
}

/** `GET /v1/token`: what the calling browser token may do (never the token itself). */
export interface TokenGrantOut {
  /** the token's grant */
  id: string;
  /** the account whose jobs it reaches */
  account_id: string;
  /** what it may do: read, create, upload */
  scopes: string[];
  /** the jobs it is limited to (with those it created); null: every job of the account */
  jobs: string[] | null;
  /** what its creates may reserve together; null: no ceiling of its own */
  credit_ceiling: number | null;
  /** what its creates reserved so far */
  credits_used: number;
  /** when it stops working */
  expires_at: string;
}

export interface TokenOut {
  /** the token's grant, as the audit and logs name it */
  id: string;
  /** send as `Authorization: Bearer <token>`, or as `?access_token=` on a GET (EventSource) */
  token: string;
  /** the account whose jobs it reaches */
  account_id: string;
  /** what it may do */
  scopes: string[];
  /** the jobs it is limited to (and those it creates); null: every job of the account */
  jobs: string[] | null;
  /** what its creates may reserve together; null: no ceiling of its own */
  credit_ceiling: number | null;
  /** when it stops working */
  expires_at: string;
}

export type TokenScope = "create" | "read" | "upload";

export interface Trail {
  /** oldest first */
  data: TransitionOut[];
}

export interface TransitionOut {
  /** None for creation */
  from: JobStatus | null;
  /** the status it moved to */
  to: JobStatus;
  /** the stage shown after the move: it never goes back, a retry keeps it */
  stage: Stage;
  /** when */
  at: string;
  /** why, in words */
  reason: string;
}

export interface UploadErrorOut {
  /** why the image was rejected */
  code: "image_corrupt" | "image_empty" | "image_too_large" | "image_unprocessed" | "image_unsupported";
  /** the same, in words */
  message: string;
}

/** An upload (`POST /v1/uploads`, `GET /v1/uploads/{id}`). It is `processing` until the media worker has
decoded it; then `ready`, its image stored upright and stripped of metadata, or `rejected`. */
export interface UploadOut {
  /** name it as a job's `input_image` once `status` is `ready` */
  id: string;
  /** processing: decoding has not finished; ready: a job may name it; rejected: `error` says why */
  status: "processing" | "ready" | "rejected";
  /** pixels: upright once ready; while processing, as the header declares them */
  width: number;
  /** pixels */
  height: number;
  /** as sniffed from the bytes */
  content_type: "image/jpeg" | "image/png" | "image/webp";
  /** of the stored (re-encoded) image once ready; while processing, of the image as received */
  bytes: number;
  /** why it was rejected; null unless it was */
  error?: UploadErrorOut | null;
}

/** The account's jobs of one model, UTC day or metadata value, created in the range. */
export interface UsageGroup {
  /** the model, the day (YYYY-MM-DD) or the metadata value; null: the jobs that do not have the metadata key */
  key: string | null;
  /** jobs created in the range (deleted ones left out) */
  jobs: number;
  /** of those, how many are in each status now */
  by_status: Record<string, number>;
  /** what the jobs that ended were charged */
  credits_charged: number;
  /** estimates still held for the jobs that have not ended */
  credits_reserved: number;
  /** seconds of video of the jobs completed (and since expired), as stored */
  seconds_delivered: number;
}

/** Query string of `GET /v1/account/usage`: the jobs created in [from, to), at most 366 days. */
export interface UsageQuery {
  /**
   * model, day (UTC; the default) or metadata.<key> (a key of 1-40 letters, digits, `_`, `.` or `-`)
   * @default "day"
   */
  group_by?: string;
  /** jobs created at or after this ISO-8601 time, with its offset; default 30 days before `to` */
  from?: string | null;
  /** jobs created before this ISO-8601 time; default now */
  to?: string | null;
}

/** Answer of `GET /v1/account/usage`. */
export interface UsageReport {
  /** as asked */
  group_by: string;
  /** the range's start, as used */
  from: string;
  /** the range's end (not included), as used */
  to: string;
  /** in key order; jobs without the metadata key last */
  data: UsageGroup[];
  /** true when there were more than 1000 groups and only the first 1000 are here */
  truncated: boolean;
}

export interface WebhookAck {
  /** the callback was taken */
  received: boolean;
  /** this delivery was stored before */
  duplicate: boolean;
  /**
   * False for a callback that names no render of ours: acknowledged, so the sender stops, and dropped.
   * @default true
   */
  stored?: boolean;
}

/** The account's secret for the webhook_url a job names, described; the secret is shown only when made. */
export interface WebhookSecretOut {
  /** when it was made; null: none yet (POST /v1/account/webhook-secret makes it) */
  created_at: string | null;
  /** until then deliveries are signed with the secret the last rotation replaced too; null: only the current */
  previous_secret_expires_at: string | null;
}

/** Every route a credential may call, keyed `METHOD /path`: what it takes and what it answers. */
export interface Operations {
  /**
   * What creating this job would reserve, checked as a create is, without creating anything
   * `estimate_job`; who may call it: {"account": true, "token_scope": "any"}
   */
  "POST /v1/estimates": {
    operationId: "estimate_job";
    path: {};
    query: {};
    headers: {};
    body: CreateJob;
    response: EstimateOut;
  };
  /**
   * Create a render job
   * `create_job`; who may call it: {"account": true, "token_scope": "create"}
   */
  "POST /v1/jobs": {
    operationId: "create_job";
    path: {};
    query: {};
    headers: {
      /** repeat a request safely: same key and body answer the same job */
      "Idempotency-Key"?: string;
    };
    body: CreateJob;
    response: JobOut;
  };
  /**
   * The account's jobs, newest first
   * `list_jobs`; who may call it: {"account": true, "token_scope": "read"}
   */
  "GET /v1/jobs": {
    operationId: "list_jobs";
    path: {};
    query: {
      /** one status or several, comma-separated */
      status?: string | null;
      /** only jobs of this model */
      model?: string | null;
      /** jobs created at or after this time */
      created_after?: string | null;
      /** jobs created before this time */
      created_before?: string | null;
      /** jobs per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: JobList;
  };
  /**
   * One job
   * `get_job`; who may call it: {"account": true, "token_scope": "read"}
   */
  "GET /v1/jobs/{job_id}": {
    operationId: "get_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: JobOut;
  };
  /**
   * Delete a job; its assets are removed in the background
   * `delete_job`; who may call it: {"account": true, "token_scope": null}
   */
  "DELETE /v1/jobs/{job_id}": {
    operationId: "delete_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: void;
  };
  /**
   * Cancel a job (unchanged if already finished)
   * `cancel_job`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/jobs/{job_id}/cancel": {
    operationId: "cancel_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: JobOut;
  };
  /**
   * The job's audit trail
   * `job_events`; who may call it: {"account": true, "token_scope": "read"}
   */
  "GET /v1/jobs/{job_id}/events": {
    operationId: "job_events";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: Trail;
  };
  /**
   * Render a job's request again as a new job (`rerun_of` names the original)
   * `rerun_job`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/jobs/{job_id}/rerun": {
    operationId: "rerun_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {
      /** repeat a rerun safely: the same key answers the same new job */
      "Idempotency-Key"?: string;
    };
    body: never;
    response: JobOut;
  };
  /**
   * Keep a ready job's clip past retention, counted against the account's storage quota
   * `keep_job`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/jobs/{job_id}/keep": {
    operationId: "keep_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: JobOut;
  };
  /**
   * Stop keeping the job's clip: retention counts from its completion again (warned before it goes)
   * `release_job`; who may call it: {"account": true, "token_scope": null}
   */
  "DELETE /v1/jobs/{job_id}/keep": {
    operationId: "release_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: JobOut;
  };
  /**
   * Copy a ready job's stored original to a presigned PUT URL of your own bucket
   * `export_job`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/jobs/{job_id}/export": {
    operationId: "export_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: ExportIn;
    response: ExportOut;
  };
  /**
   * The job's exports, newest first
   * `list_exports`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/jobs/{job_id}/exports": {
    operationId: "list_exports";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: ExportList;
  };
  /**
   * One export: pending, done or failed
   * `get_export`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/jobs/{job_id}/exports/{export_id}": {
    operationId: "get_export";
    path: {
      job_id: string;
      export_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: ExportOut;
  };
  /**
   * The models this deployment renders with, what each takes and its price per second
   * `list_models`; who may call it: {"account": true, "token_scope": "any"}
   */
  "GET /v1/models": {
    operationId: "list_models";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: ModelList;
  };
  /**
   * Register an endpoint of your app to hear of your jobs; its signing secret is shown this once
   * `create_webhook_endpoint`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/webhook-endpoints": {
    operationId: "create_webhook_endpoint";
    path: {};
    query: {};
    headers: {};
    body: EndpointIn;
    response: EndpointCreated;
  };
  /**
   * Your webhook endpoints
   * `list_webhook_endpoints`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/webhook-endpoints": {
    operationId: "list_webhook_endpoints";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: EndpointList;
  };
  /**
   * Remove an endpoint; nothing more is sent to it
   * `delete_webhook_endpoint`; who may call it: {"account": true, "token_scope": null}
   */
  "DELETE /v1/webhook-endpoints/{endpoint_id}": {
    operationId: "delete_webhook_endpoint";
    path: {
      endpoint_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: void;
  };
  /**
   * What was delivered to an endpoint, newest first, with its last attempts; keyset pagination
   * `list_webhook_deliveries`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/webhook-endpoints/{endpoint_id}/deliveries": {
    operationId: "list_webhook_deliveries";
    path: {
      endpoint_id: string;
    };
    query: {
      /** deliveries per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: DeliveryList;
  };
  /**
   * Send a delivery again now
   * `retry_webhook_delivery`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/webhook-endpoints/{endpoint_id}/deliveries/{delivery_id}/retry": {
    operationId: "retry_webhook_delivery";
    path: {
      endpoint_id: string;
      delivery_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: void;
  };
  /**
   * Replace an endpoint's signing secret, shown this once; the old one signs too for overlap_s
   * `rotate_webhook_endpoint_secret`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/webhook-endpoints/{endpoint_id}/rotate-secret": {
    operationId: "rotate_webhook_endpoint_secret";
    path: {
      endpoint_id: string;
    };
    query: {};
    headers: {};
    body: RotateSecretIn | undefined;
    response: SecretIssued;
  };
  /**
   * When the secret that signs deliveries to the webhook_url a job names was made (never the secret)
   * `account_webhook_secret`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/account/webhook-secret": {
    operationId: "account_webhook_secret";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: WebhookSecretOut;
  };
  /**
   * Make the secret that signs deliveries to the webhook_url a job names, or replace it (the old one signs too for overlap_s); shown this once
   * `issue_account_webhook_secret`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/account/webhook-secret": {
    operationId: "issue_account_webhook_secret";
    path: {};
    query: {};
    headers: {};
    body: RotateSecretIn | undefined;
    response: SecretIssued;
  };
  /**
   * Server-Sent Events: `event: job` with the job on connect and on every change; closes when terminal
   * `stream_job`; who may call it: {"account": true, "token_scope": "read"}
   */
  "GET /v1/jobs/{job_id}/stream": {
    operationId: "stream_job";
    path: {
      job_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: never;
    event: JobOut;
  };
  /**
   * Upload a PNG, JPEG or WebP image for image-to-video; it is `processing` until the media worker has decoded it, then `ready` (name its id as a job's input_image) or `rejected`
   * `create_upload`; who may call it: {"account": true, "token_scope": "upload"}
   */
  "POST /v1/uploads": {
    operationId: "create_upload";
    path: {};
    query: {};
    headers: {};
    body: Blob | ArrayBuffer | ArrayBufferView | ReadableStream<Uint8Array>;
    response: UploadOut;
  };
  /**
   * One upload: whether it is processing, ready or rejected (and why)
   * `get_upload`; who may call it: {"account": true, "token_scope": "upload"}
   */
  "GET /v1/uploads/{upload_id}": {
    operationId: "get_upload";
    path: {
      upload_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: UploadOut;
  };
  /**
   * The caller's account
   * `get_account`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/account": {
    operationId: "get_account";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: AccountOut;
  };
  /**
   * Change the account's own settings: its default fallback models
   * `update_account`; who may call it: {"account": true, "token_scope": null}
   */
  "PATCH /v1/account": {
    operationId: "update_account";
    path: {};
    query: {};
    headers: {};
    body: AccountPatch;
    response: AccountOut;
  };
  /**
   * The account's credit ledger, newest first, keyset pagination
   * `get_ledger`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/account/ledger": {
    operationId: "get_ledger";
    path: {};
    query: {
      /** entries per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: LedgerPage;
  };
  /**
   * The account's jobs created in a time range, grouped by model, UTC day or a metadata key: jobs by status, credits charged and held, seconds delivered
   * `get_usage`; who may call it: {"account": true, "token_scope": null}
   */
  "GET /v1/account/usage": {
    operationId: "get_usage";
    path: {};
    query: {
      /** model, day (UTC; the default) or metadata.<key> (a key of 1-40 letters, digits, `_`, `.` or `-`) */
      group_by?: string;
      /** jobs created at or after this ISO-8601 time, with its offset; default 30 days before `to` */
      from?: string | null;
      /** jobs created before this ISO-8601 time; default now */
      to?: string | null;
    };
    headers: {};
    body: never;
    response: UsageReport;
  };
  /**
   * The calling browser token's own grant: its scopes, jobs, credit ceiling and what its creates used, and its expiry
   * `get_token`; who may call it: {"account": false, "token_scope": "any"}
   */
  "GET /v1/token": {
    operationId: "get_token";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: TokenGrantOut;
  };
  /**
   * A short-lived browser token for this account: read and stream its jobs (or some), optionally create jobs within a credit ceiling and upload images
   * `create_account_token`; who may call it: {"account": true, "token_scope": null}
   */
  "POST /v1/account/tokens": {
    operationId: "create_account_token";
    path: {};
    query: {};
    headers: {};
    body: NewToken | undefined;
    response: TokenOut;
  };
  /**
   * The platform key's platform and scopes
   * `get_platform`; who may call it: {"platform_scope": null}
   */
  "GET /v1/platform": {
    operationId: "get_platform";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: PlatformOut;
  };
  /**
   * Make the account of one of your users (201), or answer the one made for its external_id (200)
   * `create_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "POST /v1/platform/accounts": {
    operationId: "create_platform_account";
    path: {};
    query: {};
    headers: {};
    body: CreatePlatformAccount;
    response: PlatformAccountOut;
  };
  /**
   * Your accounts, oldest first, keyset pagination; `external_id` finds one user's
   * `list_platform_accounts`; who may call it: {"platform_scope": "accounts"}
   */
  "GET /v1/platform/accounts": {
    operationId: "list_platform_accounts";
    path: {};
    query: {
      /** only the account of this user */
      external_id?: string | null;
      /** accounts per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: PlatformAccountPage;
  };
  /**
   * One of your accounts
   * `get_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "GET /v1/platform/accounts/{account_id}": {
    operationId: "get_platform_account";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: PlatformAccountOut;
  };
  /**
   * Change an account's name, limits or plan
   * `update_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "PATCH /v1/platform/accounts/{account_id}": {
    operationId: "update_platform_account";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: PatchPlatformAccount;
    response: PlatformAccountOut;
  };
  /**
   * Delete an account: closed now (keys revoked, live jobs canceled), then its rows and stored objects are purged
   * `delete_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "DELETE /v1/platform/accounts/{account_id}": {
    operationId: "delete_platform_account";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: DeletedAccountOut;
  };
  /**
   * Disable an account: its waiting jobs are canceled and their credit released; running ones finish or are stopped
   * `disable_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "POST /v1/platform/accounts/{account_id}/disable": {
    operationId: "disable_platform_account";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: DisableAccount | undefined;
    response: DisabledOut;
  };
  /**
   * Enable a disabled account again
   * `enable_platform_account`; who may call it: {"platform_scope": "accounts"}
   */
  "POST /v1/platform/accounts/{account_id}/enable": {
    operationId: "enable_platform_account";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: PlatformAccountOut;
  };
  /**
   * Grant or take back credit, once per idempotency_key
   * `change_platform_account_credit`; who may call it: {"platform_scope": "credits"}
   */
  "POST /v1/platform/accounts/{account_id}/credits": {
    operationId: "change_platform_account_credit";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: CreditChange;
    response: CreditChangeOut;
  };
  /**
   * An account's credit ledger, newest first
   * `get_platform_account_ledger`; who may call it: {"platform_scope": "credits"}
   */
  "GET /v1/platform/accounts/{account_id}/ledger": {
    operationId: "get_platform_account_ledger";
    path: {
      account_id: string;
    };
    query: {
      /** entries per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: LedgerPage;
  };
  /**
   * An account's jobs in a time range, grouped (as GET /v1/account/usage)
   * `get_platform_account_usage`; who may call it: {"platform_scope": "usage"}
   */
  "GET /v1/platform/accounts/{account_id}/usage": {
    operationId: "get_platform_account_usage";
    path: {
      account_id: string;
    };
    query: {
      /** model, day (UTC; the default) or metadata.<key> (a key of 1-40 letters, digits, `_`, `.` or `-`) */
      group_by?: string;
      /** jobs created at or after this ISO-8601 time, with its offset; default 30 days before `to` */
      from?: string | null;
      /** jobs created before this ISO-8601 time; default now */
      to?: string | null;
    };
    headers: {};
    body: never;
    response: UsageReport;
  };
  /**
   * Issue an API key for an account; shown once
   * `create_platform_account_key`; who may call it: {"platform_scope": "keys"}
   */
  "POST /v1/platform/accounts/{account_id}/keys": {
    operationId: "create_platform_account_key";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: NewKey | undefined;
    response: NewKeyOut;
  };
  /**
   * An account's API keys (never the keys)
   * `list_platform_account_keys`; who may call it: {"platform_scope": "keys"}
   */
  "GET /v1/platform/accounts/{account_id}/keys": {
    operationId: "list_platform_account_keys";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: KeyList;
  };
  /**
   * Revoke one of an account's API keys (its browser tokens die with it)
   * `revoke_platform_account_key`; who may call it: {"platform_scope": "keys"}
   */
  "DELETE /v1/platform/accounts/{account_id}/keys/{key_id}": {
    operationId: "revoke_platform_account_key";
    path: {
      account_id: string;
      key_id: string;
    };
    query: {};
    headers: {};
    body: never;
    response: void;
  };
  /**
   * A short-lived browser token for one of your accounts
   * `create_platform_account_token`; who may call it: {"platform_scope": "tokens"}
   */
  "POST /v1/platform/accounts/{account_id}/tokens": {
    operationId: "create_platform_account_token";
    path: {
      account_id: string;
    };
    query: {};
    headers: {};
    body: NewToken | undefined;
    response: TokenOut;
  };
  /**
   * Make or change a plan; every account on it takes its limits at once
   * `put_platform_plan`; who may call it: {"platform_scope": "accounts"}
   */
  "PUT /v1/platform/plans/{plan}": {
    operationId: "put_platform_plan";
    path: {
      plan: string;
    };
    query: {};
    headers: {};
    body: Plan;
    response: PlanOut;
  };
  /**
   * Your plans
   * `list_platform_plans`; who may call it: {"platform_scope": "accounts"}
   */
  "GET /v1/platform/plans": {
    operationId: "list_platform_plans";
    path: {};
    query: {};
    headers: {};
    body: never;
    response: PlanList;
  };
  /**
   * Every change your platform keys made, newest first
   * `get_platform_audit`; who may call it: {"platform_scope": null}
   */
  "GET /v1/platform/audit": {
    operationId: "get_platform_audit";
    path: {};
    query: {
      /** only the lines about this account */
      account_id?: string | null;
      /** lines per page, 1-100 */
      limit?: number;
      /** next_cursor of the previous page */
      cursor?: string | null;
    };
    headers: {};
    body: never;
    response: AuditPage;
  };
}

/** A route of the API, as `Operations` keys it. */
export type Route = keyof Operations;
