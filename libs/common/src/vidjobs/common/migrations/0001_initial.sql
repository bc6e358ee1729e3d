-- rollout: first: the first schema: there is no release before it.
-- The first schema. Each table names its owner: only that service writes it (jobs, job_transitions and
-- outbox are written only through libs/common's transition function and outbox).

-- libs/common ------------------------------------------------------------------------------------------
CREATE TYPE job_status AS ENUM (
    'pending', 'submitted', 'processing', 'retrying', 'downloading',
    'completed', 'failed', 'canceled', 'expired'
);

-- gateway --------------------------------------------------------------------------------------------
CREATE TABLE accounts (
    id               text PRIMARY KEY,
    name             text NOT NULL,
    concurrent_jobs  integer NOT NULL DEFAULT 2 CHECK (concurrent_jobs > 0),
    credits_balance  bigint NOT NULL DEFAULT 0,
    credits_reserved bigint NOT NULL DEFAULT 0 CHECK (credits_reserved >= 0),
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          text PRIMARY KEY,
    account_id  text NOT NULL REFERENCES accounts (id),
    key_hash    bytea NOT NULL,
    prefix      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CONSTRAINT api_keys_hash_unique UNIQUE (key_hash)
);

-- libs/common ------------------------------------------------------------------------------------------
CREATE TABLE jobs (
    id                text PRIMARY KEY,
    account_id        text NOT NULL REFERENCES accounts (id),
    status            job_status NOT NULL DEFAULT 'pending',
    model             text NOT NULL,
    provider          text NOT NULL,
    request           jsonb NOT NULL,
    attempt           integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    provider_job_id   text,
    provider_output   text,           -- where the provider serves the finished render
    progress          real CHECK (progress IS NULL OR (progress >= 0 AND progress <= 1)),
    error             jsonb,
    outputs           jsonb,
    estimated_credits bigint NOT NULL DEFAULT 0,
    actual_credits    bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    retry_at          timestamptz,    -- retrying: when the backoff ends
    deadline_at       timestamptz,    -- the current stage's hard deadline
    recover_at        timestamptz,    -- when the reaper looks at this job next; NULL once terminal
    deleted_at        timestamptz,
    CONSTRAINT jobs_terminal_not_recovered CHECK (
        recover_at IS NULL OR status NOT IN ('completed', 'failed', 'canceled', 'expired'))
);

-- Newest-first listing per account, keyset-paginated on (created_at, id).
CREATE INDEX jobs_account_listing ON jobs (account_id, created_at DESC, id DESC) WHERE deleted_at IS NULL;
-- A provider's id names one job.
CREATE UNIQUE INDEX jobs_provider_ref ON jobs (provider, provider_job_id) WHERE provider_job_id IS NOT NULL;
-- The reaper's sweep scans only jobs that still need watching.
CREATE INDEX jobs_recover_due ON jobs (recover_at) WHERE recover_at IS NOT NULL;

CREATE TABLE job_transitions (
    id          bigserial PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    from_status job_status,           -- NULL for creation
    to_status   job_status NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    reason      text NOT NULL DEFAULT ''
);
CREATE INDEX job_transitions_job ON job_transitions (job_id, id);

CREATE TABLE outbox (
    id         bigserial PRIMARY KEY,
    subject    text NOT NULL,
    payload    bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- gateway --------------------------------------------------------------------------------------------
CREATE TABLE idempotency_keys (
    account_id   text NOT NULL REFERENCES accounts (id),
    key          text NOT NULL,
    request_hash bytea NOT NULL,
    job_id       text NOT NULL REFERENCES jobs (id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, key)
);

CREATE TABLE webhook_inbox (
    id          bigserial PRIMARY KEY,
    provider    text NOT NULL,
    webhook_id  text NOT NULL,
    payload     bytea NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT webhook_inbox_once UNIQUE (provider, webhook_id)
);

-- submitter ------------------------------------------------------------------------------------------
-- Written before the provider is called, so a crash mid-call is visible and never rendered twice.
CREATE TABLE provider_submissions (
    id              bigserial PRIMARY KEY,
    job_id          text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt         integer NOT NULL,
    provider        text NOT NULL,
    idempotency_key text NOT NULL,
    provider_job_id text,
    error           jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    claimed_at      timestamptz NOT NULL DEFAULT now(),  -- a submitter is calling the provider since then
    answered_at     timestamptz,
    CONSTRAINT provider_submissions_one_per_attempt UNIQUE (job_id, attempt)
);

-- poller ---------------------------------------------------------------------------------------------
CREATE TABLE poll_schedule (
    job_id       text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    next_poll_at timestamptz NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    polls        integer NOT NULL DEFAULT 0
);
CREATE INDEX poll_schedule_due ON poll_schedule (next_poll_at);

-- media ----------------------------------------------------------------------------------------------
CREATE TABLE assets (
    id           bigserial PRIMARY KEY,
    job_id       text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    account_id   text NOT NULL REFERENCES accounts (id),
    kind         text NOT NULL CHECK (kind IN ('video', 'thumbnail', 'preview')),
    key          text NOT NULL,
    content_type text NOT NULL,
    bytes        bigint NOT NULL,
    sha256       text NOT NULL,
    width        integer,
    height       integer,
    duration_s   double precision,
    created_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at   timestamptz,
    CONSTRAINT assets_one_per_kind UNIQUE (job_id, kind)
);

-- reaper ---------------------------------------------------------------------------------------------
CREATE TABLE recovery_leases (
    job_id     text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    token      uuid NOT NULL,
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL
);
