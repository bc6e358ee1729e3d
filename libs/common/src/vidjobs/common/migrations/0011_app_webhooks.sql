-- rollout: expand: new tables and a nullable column the release before it never touches.
-- Webhooks to accounts' apps (services/gateway/appwebhooks.py): the endpoints an account registers, the
-- URL a job names for itself, and each delivery with its attempts.

-- gateway --------------------------------------------------------------------------------------------
CREATE TABLE webhook_endpoints (
    id              text PRIMARY KEY,
    account_id      text NOT NULL REFERENCES accounts (id),
    url             text NOT NULL,
    secret          text NOT NULL,             -- whsec_...: shown once, when the endpoint is made
    events          text[] NOT NULL,
    description     text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled_at     timestamptz,               -- it answered 410 Gone: nothing more is sent to it
    disabled_reason text,
    deleted_at      timestamptz
);
CREATE INDEX webhook_endpoints_account ON webhook_endpoints (account_id) WHERE deleted_at IS NULL;

-- Signs deliveries to the webhook_url a job names for itself; made on first use.
ALTER TABLE accounts ADD COLUMN webhook_secret text;

CREATE TABLE webhook_deliveries (
    id              text PRIMARY KEY,          -- also its webhook-id: a receiver stores each one once
    account_id      text NOT NULL REFERENCES accounts (id),
    endpoint_id     text REFERENCES webhook_endpoints (id),  -- NULL: the job's own webhook_url
    job_id          text NOT NULL,
    event_type      text NOT NULL,
    event_key       text NOT NULL,             -- the move it tells of: the same move is delivered once
    url             text NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,               -- pending: when it is due (a claim pushes it out)
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE UNIQUE INDEX webhook_deliveries_once ON webhook_deliveries (event_key, event_type, COALESCE(endpoint_id, ''));
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at DESC);
CREATE INDEX webhook_deliveries_job ON webhook_deliveries (job_id);

CREATE TABLE webhook_attempts (
    id          bigserial PRIMARY KEY,
    delivery_id text NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    status      integer,                       -- the HTTP status answered; NULL when none came
    error       text,
    ms          integer NOT NULL
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, id);

-- libs/common ----------------------------------------------------------------------------------------
ALTER TABLE jobs ADD COLUMN webhook_url text;
ALTER TABLE jobs ADD COLUMN webhook_events text[];
