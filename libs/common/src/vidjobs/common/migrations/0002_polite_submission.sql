-- rollout: expand: nullable columns, new tables and an index; the release before it never reads or writes them.
-- Submitting politely: provider caps, rate buckets and circuit breakers shared by every submitter replica,
-- a visible reason while a job waits, and the rollout route a job was sent down.

-- libs/common ------------------------------------------------------------------------------------------
ALTER TABLE jobs ADD COLUMN route text;         -- the model alias the job was created with, if any
ALTER TABLE jobs ADD COLUMN wait_reason text;   -- why a queued job is not submitted yet

-- submitter ------------------------------------------------------------------------------------------
CREATE TABLE provider_rate_buckets (
    provider   text PRIMARY KEY,
    tokens     double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE provider_breakers (
    provider     text PRIMARY KEY,
    state        text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    failures     integer NOT NULL DEFAULT 0,   -- consecutive provider_unavailable answers
    opened_at    timestamptz,
    reopen_at    timestamptz,                  -- open: when one probe may go through
    probe_job_id text,                         -- half_open: the one job allowed to try
    cooldown_s   double precision NOT NULL DEFAULT 0
);

-- The submitter counts each provider's renders in flight before admitting another.
CREATE INDEX jobs_provider_active ON jobs (provider)
    WHERE status IN ('submitted', 'processing') AND deleted_at IS NULL;
