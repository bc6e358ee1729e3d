-- rollout: contract: with its grants, takes away the direct writes on credit that the release before it makes: where
-- each service has its own login, those pods are refused until replaced.
-- split: expand = the functions, and a release whose services call them and no longer write credit directly;
-- contract = the grants taken away, in the release after it.
-- Credit changes as functions (libs/common/credits.py). No service holds a write privilege on accounts'
-- credit, credit_ledger or account_daily_spend (libs/common/grants.py): the gateway reserves for a new job
-- and every service settles an ended one through the two SECURITY DEFINER functions below, which run as
-- their owner (the migrator) and do nothing else. Whatever a service writes on a job row, a settlement
-- releases exactly what the job's reservation in the ledger holds and charges between 0 and that, once:
-- calling them cannot add credit to any account. Only the operator, as the migrator, grants credit.
--
-- Refusals: a move reserving or settling never makes raises insufficient_privilege; a guardrail a new job
-- would pass raises check_violation naming the constraint `credit_guardrails` (the API answers 402).

-- libs/common ------------------------------------------------------------------------------------------

-- Change an account's balance and reservation and append the ledger entry saying so, in one statement, so
-- the two cannot disagree. NULL when there is no such account. Runs with its caller's privileges, which
-- no service has: it is called by the functions below, and by grant_credit as the operator.
CREATE FUNCTION credit_move(p_account_id text, p_kind ledger_kind, p_balance bigint, p_reserved bigint,
                            p_job_id text, p_note text) RETURNS credit_ledger
LANGUAGE plpgsql AS $$
DECLARE
    entry credit_ledger;
BEGIN
    WITH moved AS (
        UPDATE accounts SET credits_balance = credits_balance + p_balance,
                            credits_reserved = credits_reserved + p_reserved
        WHERE id = p_account_id
        RETURNING id, credits_balance, credits_reserved
    )
    INSERT INTO credit_ledger (account_id, job_id, kind, balance_change, reserved_change, balance_after,
                               reserved_after, note)
    SELECT moved.id, p_job_id, p_kind, p_balance, p_reserved, moved.credits_balance, moved.credits_reserved, p_note
    FROM moved
    RETURNING * INTO entry;
    RETURN entry;
END $$;

-- Add to the credit committed on an account's UTC day (a negative amount takes back).
CREATE FUNCTION credit_commit_day(p_account_id text, p_day date, p_amount bigint) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO account_daily_spend AS d (account_id, day, committed) VALUES (p_account_id, p_day, p_amount)
    ON CONFLICT (account_id, day) DO UPDATE SET committed = d.committed + EXCLUDED.committed
$$;

-- Hold `p_amount` credits for a job about to be created in this transaction, if the account's guardrails
-- allow it: the per-job maximum, today's spend cap, and the free credit. The account's row stays locked
-- until the transaction ends, so racing creates are decided one at a time. Refuses a negative amount, and
-- a job that exists already or has any ledger entry: one reservation per job, made before the job.
CREATE FUNCTION reserve_job_credit(p_account_id text, p_job_id text, p_amount bigint) RETURNS credit_ledger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    account record;
    today date := (now() AT TIME ZONE 'UTC')::date;  -- the day of a job created in this transaction
    spent bigint;
BEGIN
    IF p_amount IS NULL OR p_amount < 0 THEN
        RAISE EXCEPTION 'reserve_job_credit refuses: % is not an estimate', p_amount
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- Every credit change locks the account's row first, before the day's spend: no deadlock between them.
    SELECT credits_balance - credits_reserved AS free, daily_spend_cap, max_job_credits INTO account
    FROM accounts WHERE id = p_account_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM credit_ledger WHERE job_id = p_job_id) OR EXISTS (SELECT 1 FROM jobs WHERE id = p_job_id) THEN
        RAISE EXCEPTION 'reserve_job_credit refuses: % is not a new job', p_job_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_amount > account.max_job_credits THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'credit_guardrails', MESSAGE = format(
            'this job is estimated at %s credits, above the account''s per-job maximum of %s; choose a shorter '
            'or lower-resolution render', p_amount, account.max_job_credits);
    END IF;
    IF account.daily_spend_cap IS NOT NULL THEN
        spent := COALESCE((SELECT committed FROM account_daily_spend
                           WHERE account_id = p_account_id AND day = today), 0);
        IF spent + p_amount > account.daily_spend_cap THEN
            RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'credit_guardrails', MESSAGE = format(
                'this job needs %s credits and %s of today''s cap of %s are committed; the cap resets at '
                '00:00 UTC', p_amount, spent, account.daily_spend_cap);
        END IF;
    END IF;
    IF account.free < p_amount THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', CONSTRAINT = 'credit_guardrails', MESSAGE = format(
            'this job needs %s credits and the account has %s free; add credit or wait for running jobs to '
            'finish', p_amount, GREATEST(account.free, 0));
    END IF;
    PERFORM credit_commit_day(p_account_id, today, p_amount);
    RETURN credit_move(p_account_id, 'reserve'::ledger_kind, 0::bigint, p_amount, p_job_id,
                       format('estimate for %s', p_job_id));
END $$;

-- A job ended (a terminal status, or deleted): release its reservation and charge what it owes, its
-- `actual_credits`, never below 0 and never above what was reserved; the day's committed credit becomes
-- that charge. The account and the amount come from the job's reservation in the ledger, which no service
-- can write, not from the job row, which services update. Refuses a job without a reservation, one
-- settled already, one that has not ended, and one whose row names another account.
CREATE FUNCTION settle_job_credit(p_job_id text, p_note text) RETURNS credit_ledger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    held credit_ledger;
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
    charge := LEAST(GREATEST(COALESCE(job.actual_credits, 0), 0), held.reserved_change);
    held := credit_move(held.account_id, CASE WHEN charge > 0 THEN 'charge' ELSE 'release' END::ledger_kind,
                        -charge, -held.reserved_change, p_job_id, p_note);
    -- After the account's row, as reserving does. The day is the job's: the one its estimate was committed on.
    PERFORM credit_commit_day(held.account_id, (job.created_at AT TIME ZONE 'UTC')::date,
                              charge + held.reserved_change);
    RETURN held;
END $$;

-- Add credit, or (negative) take unreserved credit back: the operator's `vidjobs credits grant`. Runs with
-- the caller's privileges, so only the migrator may.
CREATE FUNCTION grant_credit(p_account_id text, p_amount bigint, p_note text) RETURNS credit_ledger
LANGUAGE sql AS $$
    SELECT credit_move(p_account_id, 'grant'::ledger_kind, p_amount, 0::bigint, NULL::text, p_note)
$$;

-- Nobody but their owner runs these until libs/common/grants.py grants EXECUTE on the two a service calls.
-- Each looks its tables up in this schema only: a session's own objects (pg_temp) cannot stand in for them,
-- and no service may create objects in this schema (grants.py), so none can stand in for what they call.
-- Their calls name exact argument types all the same.
DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['credit_move(text, ledger_kind, bigint, bigint, text, text)',
                              'credit_commit_day(text, date, bigint)',
                              'reserve_job_credit(text, text, bigint)',
                              'settle_job_credit(text, text)',
                              'grant_credit(text, bigint, text)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
