-- rollout: expand: a new table, a defaulted ledger column, a ledger kind the release before it never writes, and a
-- settlement function that charges exactly what the old one did.
-- What each attempt's render cost the platform (libs/common/attempt_costs.py), and what of it the platform paid
-- without charging the account: a job's provider cost is the sum over its attempts; its charge stays within
-- its reservation and is for the attempt at hand, as before. At settlement what was not charged is written to
-- the ledger as an `absorb` entry, which moves no credit: the bills of the attempts before the one at hand
-- (failed and retried), and whatever the provider billed for the one at hand above its charge.
-- Safe beside the release before it: that release writes no attempt rows, so for its jobs the new settlement
-- charges and releases what the old one did and writes no `absorb` entry. (A gateway of that release cannot
-- name the new kind: once a job this release's poller priced settles, its ledger page answers 500 there until
-- the gateway is replaced, as for 0019's `reprice`; docs/UPGRADES.md.)

-- libs/common ------------------------------------------------------------------------------------------
-- One row per attempt whose provider reported what it billed, written by the poller with the report (the
-- latest report of an attempt stands: a repeated callback does not count twice). The provider, the model and
-- the account are the attempt's, kept here so that the platform's figures outlive the job's later moves. No
-- foreign key, as in the ledger: what the platform paid outlives anything it mentions.
CREATE TABLE attempt_costs (
    job_id            text NOT NULL,
    attempt           integer NOT NULL CHECK (attempt >= 1),
    account_id        text NOT NULL,
    provider          text NOT NULL,
    model             text NOT NULL,
    provider_job_id   text,
    cost_usd          numeric CHECK (cost_usd >= 0),      -- as the provider reported it; NULL where it gave none
    cost_credits      bigint CHECK (cost_credits >= 0),   -- at the job's rate card; NULL where there is no USD
    rate_card_version integer,
    reported_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, attempt)
);

-- Credits the platform paid a provider for the job beyond what the account was charged; non-zero only on
-- `absorb` entries, which change neither the balance nor the reservation.
ALTER TABLE credit_ledger ADD COLUMN absorbed bigint NOT NULL DEFAULT 0 CHECK (absorbed >= 0);
ALTER TYPE ledger_kind ADD VALUE IF NOT EXISTS 'absorb';

-- As 0019's, and then: the bills of the job's earlier attempts, and what its last attempt's bill exceeds the
-- charge by, are entered as absorbed. It runs as its owner, so it reads the attempt rows whoever settles; an account's
-- credit is not touched by it.
CREATE OR REPLACE FUNCTION settle_job_credit(p_job_id text, p_note text) RETURNS credit_ledger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    held credit_ledger;
    amount bigint;
    job record;
    charge bigint;
    earlier bigint;
    last bigint;
    attempts integer;
BEGIN
    SELECT * INTO held FROM credit_ledger WHERE job_id = p_job_id AND kind = 'reserve';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'settle_job_credit refuses: % holds no reservation', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The account's row first, as every credit change: a settlement racing this one waits here, then sees it.
    PERFORM 1 FROM accounts WHERE id = held.account_id FOR NO KEY UPDATE;
    IF EXISTS (SELECT 1 FROM credit_ledger WHERE job_id = p_job_id AND kind IN ('release', 'charge')) THEN
        RAISE EXCEPTION 'settle_job_credit refuses: % is settled already', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT account_id, status, deleted_at, actual_credits, created_at, attempt INTO job FROM jobs WHERE id = p_job_id;
    IF NOT FOUND OR job.account_id IS DISTINCT FROM held.account_id
            OR (job.deleted_at IS NULL AND job.status NOT IN ('completed', 'failed', 'canceled', 'expired')) THEN
        RAISE EXCEPTION 'settle_job_credit refuses: % has not ended on the account it reserved from', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    amount := (SELECT sum(reserved_change) FROM credit_ledger WHERE job_id = p_job_id AND kind IN ('reserve', 'reprice'));
    charge := LEAST(GREATEST(COALESCE(job.actual_credits, 0), 0), amount);
    held := credit_move(held.account_id, CASE WHEN charge > 0 THEN 'charge' ELSE 'release' END::ledger_kind,
                        -charge, -amount, p_job_id, p_note);
    -- After the account's row, as reserving does. The day is the job's: the one its estimate was committed on.
    PERFORM credit_commit_day(held.account_id, (job.created_at AT TIME ZONE 'UTC')::date, charge - amount);
    -- The charge is for the attempt at hand (credits.owed_sql); no earlier attempt's bill is ever charged.
    SELECT COALESCE(sum(cost_credits) FILTER (WHERE attempt <> job.attempt), 0),
           COALESCE(sum(cost_credits) FILTER (WHERE attempt = job.attempt), 0), count(cost_credits)
    INTO earlier, last, attempts
    FROM attempt_costs WHERE job_id = p_job_id;
    IF earlier + GREATEST(last - charge, 0) > 0 THEN
        INSERT INTO credit_ledger (account_id, job_id, kind, balance_change, reserved_change, balance_after,
                                   reserved_after, absorbed, note)
        VALUES (held.account_id, p_job_id, 'absorb', 0, 0, held.balance_after, held.reserved_after,
                earlier + GREATEST(last - charge, 0),
                format('%s: the provider billed %s credits over %s attempt(s) (%s for attempt %s) and %s were '
                       'charged; the platform absorbed %s', p_job_id, earlier + last, attempts, last, job.attempt,
                       charge, earlier + GREATEST(last - charge, 0)));
    END IF;
    RETURN held;
END $$;

DO $$
BEGIN
    EXECUTE 'REVOKE EXECUTE ON FUNCTION settle_job_credit(text, text) FROM PUBLIC';
    EXECUTE format('ALTER FUNCTION settle_job_credit(text, text) SET search_path = %I, pg_temp', current_schema());
END $$;
