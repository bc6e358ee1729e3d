-- rollout: expand: defaulted columns, a ledger kind the release before it never writes, and a settlement function that
-- still does what it did for that release's jobs.
-- Failover: a waiting job may name fallback models (or take its account's default list), and moves to the
-- first that can start it sooner when its provider's breaker is open or its estimated start passes its
-- `max_wait_s` (services/submitter/failover.py). A move to a cheaper model lowers its reservation.
-- Safe beside the release before it: new columns with defaults, a new ledger kind that release never writes,
-- and settle_job_credit replaced by one that reads the same ledger the old one did plus the new entries.

-- gateway writes, submitter reads and moves ------------------------------------------------------------
ALTER TABLE jobs ADD COLUMN fallback_models text[] NOT NULL DEFAULT '{}',
                 ADD COLUMN max_wait_s integer CHECK (max_wait_s > 0),
                 -- created_at + max_wait_s: when waiting longer would break the owner's limit
                 ADD COLUMN max_wait_until timestamptz;
-- The account's default list, copied onto each of its new jobs that names none.
ALTER TABLE accounts ADD COLUMN fallback_models text[] NOT NULL DEFAULT '{}';

-- A provider's waiting jobs that may move: by when they must start (the limit's check), and in queue order
-- (the breaker's). Jobs without fallbacks, nearly all of a backlog, are in neither.
CREATE INDEX jobs_waiting_movable ON jobs (provider, max_wait_until, created_at, id)
    WHERE status = 'pending' AND deleted_at IS NULL AND fallback_models <> '{}';

-- A reservation lowered for a move to a cheaper model (reserved_change < 0, balance unchanged).
ALTER TYPE ledger_kind ADD VALUE IF NOT EXISTS 'reprice';

-- Lower a waiting job's reservation to `p_amount` (its new model's quote). Refuses anything else: a job that
-- holds no reservation, is settled, is not waiting, or an amount above what it holds; so a service that
-- misbehaves can free its own account's credit for use, never add to it. The amount held is the reservation
-- plus every earlier reprice, read from the ledger, which no service can write.
CREATE FUNCTION reprice_job_credit(p_job_id text, p_amount bigint, p_note text) RETURNS credit_ledger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    held bigint;
    owner text;
    job record;
BEGIN
    SELECT account_id INTO owner FROM credit_ledger WHERE job_id = p_job_id AND kind = 'reserve';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'reprice_job_credit refuses: % holds no reservation', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM accounts WHERE id = owner FOR NO KEY UPDATE;
    SELECT account_id, status, deleted_at, created_at INTO job FROM jobs WHERE id = p_job_id;
    IF NOT FOUND OR job.account_id IS DISTINCT FROM owner OR job.deleted_at IS NOT NULL OR job.status <> 'pending'
            OR EXISTS (SELECT 1 FROM credit_ledger WHERE job_id = p_job_id AND kind IN ('release', 'charge')) THEN
        RAISE EXCEPTION 'reprice_job_credit refuses: % is not waiting on the account it reserved from', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    held := (SELECT sum(reserved_change) FROM credit_ledger WHERE job_id = p_job_id AND kind IN ('reserve', 'reprice'));
    IF p_amount IS NULL OR p_amount < 0 OR p_amount > held THEN
        RAISE EXCEPTION 'reprice_job_credit refuses: % would raise the % credits held for %', p_amount, held, p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM credit_commit_day(owner, (job.created_at AT TIME ZONE 'UTC')::date, p_amount - held);
    RETURN credit_move(owner, 'reprice'::ledger_kind, 0::bigint, p_amount - held, p_job_id, p_note);
END $$;

-- As 0014's, but what is held is the reservation plus its reprices.
CREATE OR REPLACE FUNCTION settle_job_credit(p_job_id text, p_note text) RETURNS credit_ledger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    held credit_ledger;
    amount bigint;
    job record;
    charge bigint;
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
    SELECT account_id, status, deleted_at, actual_credits, created_at INTO job FROM jobs WHERE id = p_job_id;
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
    RETURN held;
END $$;

-- As 0014 does for its functions: nobody runs the new one until grants.py says so, and both look their tables
-- up in this schema only (CREATE OR REPLACE dropped the settlement's pinned search_path; it is set again).
DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['reprice_job_credit(text, bigint, text)', 'settle_job_credit(text, text)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
