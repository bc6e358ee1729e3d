-- rollout: expand: nullable or defaulted columns, new tables and indexes, and a check that reservations stay
-- within the balance.
-- Accounts, fairness and money: guardrails on accounts, named keys with a request-rate bucket, an
-- append-only credit ledger, a versioned rate card, a platform-wide submission switch, and the indexes the
-- fair scheduler and queue positions read.

-- gateway --------------------------------------------------------------------------------------------
ALTER TABLE accounts
    ADD COLUMN daily_spend_cap bigint CHECK (daily_spend_cap IS NULL OR daily_spend_cap >= 0),
    ADD COLUMN max_job_credits bigint CHECK (max_job_credits IS NULL OR max_job_credits > 0),
    ADD COLUMN requests_per_s double precision CHECK (requests_per_s IS NULL OR requests_per_s > 0),
    ADD COLUMN request_burst integer CHECK (request_burst IS NULL OR request_burst >= 1);
-- Charges never exceed what was reserved, so credit held for running jobs is always covered.
ALTER TABLE accounts ADD CONSTRAINT accounts_reserved_covered CHECK (credits_reserved <= credits_balance);

ALTER TABLE api_keys
    ADD COLUMN name text NOT NULL DEFAULT '',
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN rate_tokens double precision,       -- the key's request bucket; NULL: full
    ADD COLUMN rate_updated_at timestamptz;
CREATE INDEX api_keys_account ON api_keys (account_id);

-- Every change of an account's balance or reservation, with the state it left behind. Written in the
-- same statement as the change itself (libs/common/credits.py), never updated, never deleted.
CREATE TYPE ledger_kind AS ENUM ('opening', 'grant', 'reserve', 'release', 'charge');
CREATE TABLE credit_ledger (
    id              bigserial PRIMARY KEY,
    account_id      text NOT NULL REFERENCES accounts (id),
    job_id          text,             -- no foreign key: the ledger outlives anything it mentions
    kind            ledger_kind NOT NULL,
    balance_change  bigint NOT NULL,
    reserved_change bigint NOT NULL,
    balance_after   bigint NOT NULL,
    reserved_after  bigint NOT NULL,
    note            text NOT NULL DEFAULT '',
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX credit_ledger_account ON credit_ledger (account_id, id);
CREATE INDEX credit_ledger_job ON credit_ledger (job_id) WHERE job_id IS NOT NULL;

CREATE FUNCTION credit_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'credit_ledger is append-only: write a new entry instead of changing %', TG_OP;
END $$;
CREATE TRIGGER credit_ledger_no_update BEFORE UPDATE OR DELETE ON credit_ledger
    FOR EACH ROW EXECUTE FUNCTION credit_ledger_append_only();
CREATE TRIGGER credit_ledger_no_truncate BEFORE TRUNCATE ON credit_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION credit_ledger_append_only();

-- What each account had before the ledger existed, so the ledger sums to every balance from the start.
INSERT INTO credit_ledger (account_id, kind, balance_change, reserved_change, balance_after, reserved_after, note)
SELECT id, 'opening', credits_balance, credits_reserved, credits_balance, credits_reserved,
       'balance and reservations before the ledger'
FROM accounts;

-- Credit committed per account and UTC day of job creation: estimates while reserved, then what was charged.
CREATE TABLE account_daily_spend (
    account_id text NOT NULL REFERENCES accounts (id),
    day        date NOT NULL,
    committed  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day)
);

-- Prices: credits per second of video, by model and resolution. A new card is a new version; a job keeps
-- the version it was priced with. `model` is exact (`fake/default`), a provider (`fake/*`) or `*`.
CREATE TABLE rate_cards (
    version         integer PRIMARY KEY,
    credits_per_usd double precision NOT NULL CHECK (credits_per_usd > 0),  -- a provider's reported cost
    note            text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE rate_card_prices (
    version            integer NOT NULL REFERENCES rate_cards (version),
    model              text NOT NULL,
    resolution         text NOT NULL CHECK (resolution IN ('480p', '720p', '1080p')),
    credits_per_second numeric NOT NULL CHECK (credits_per_second > 0),
    PRIMARY KEY (version, model, resolution)
);
INSERT INTO rate_cards (version, credits_per_usd, note) VALUES (1, 100, 'launch prices');
INSERT INTO rate_card_prices (version, model, resolution, credits_per_second)
VALUES (1, '*', '480p', 10), (1, '*', '720p', 10), (1, '*', '1080p', 15);

-- libs/common ------------------------------------------------------------------------------------------
ALTER TABLE jobs ADD COLUMN rate_card_version integer;
ALTER TABLE jobs ADD COLUMN provider_cost_credits bigint;  -- what the provider reported billing, in credits

-- A switch every submitter obeys: while paused, nothing new goes to any provider; running jobs go on.
CREATE TABLE platform_controls (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    reason     text NOT NULL DEFAULT '',
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO platform_controls (name) VALUES ('submissions');

-- An account's waiting jobs in order (queue_position), and a provider's per account (the fair pick).
CREATE INDEX jobs_account_waiting ON jobs (account_id, created_at, id) WHERE status = 'pending' AND deleted_at IS NULL;
CREATE INDEX jobs_provider_waiting ON jobs (provider, account_id, created_at, id)
    WHERE status = 'pending' AND deleted_at IS NULL;
CREATE INDEX jobs_account_rendering ON jobs (account_id)
    WHERE status IN ('submitted', 'processing') AND deleted_at IS NULL;

-- submitter ------------------------------------------------------------------------------------------
CREATE INDEX provider_submissions_unanswered ON provider_submissions (job_id) WHERE answered_at IS NULL;
-- When each account was last handed a provider slot: among equally served accounts, the one that waited
-- longest goes next (round robin).
CREATE TABLE account_turns (
    account_id   text PRIMARY KEY REFERENCES accounts (id),
    last_turn_at timestamptz NOT NULL
);

-- gateway --------------------------------------------------------------------------------------------
-- Idempotency keys are kept for 24 hours; the sweep finds old ones by age.
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
