-- rollout: expand: new tables, nullable columns and new functions; the release before it reads none of them.
-- A product plugs vidjobs in (docs/INTEGRATING.md): platform credentials its backend holds, accounts made for
-- its users through the API (keyed by the product's own user id), named plans of limits, credit granted and
-- taken back with an idempotency key, short-lived browser tokens, and an audit trail of every platform action.

-- gateway --------------------------------------------------------------------------------------------
CREATE TABLE platforms (
    id         text PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Stored as the key's SHA-256, like API keys. A key is live until `revoked_at` and until `expires_at`: a
-- rotation gives the old key an expiry, so both work for the overlap.
CREATE TABLE platform_keys (
    id           text PRIMARY KEY,
    platform_id  text NOT NULL REFERENCES platforms (id),
    key_hash     bytea NOT NULL UNIQUE,
    prefix       text NOT NULL,
    name         text NOT NULL DEFAULT '',
    scopes       text[] NOT NULL
        CHECK (scopes <@ ARRAY['accounts', 'credits', 'keys', 'tokens', 'usage', 'act']::text[]),
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    expires_at   timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX platform_keys_platform ON platform_keys (platform_id);

-- A named set of limits a platform gives its accounts; an account on a plan holds a copy of them, rewritten
-- when the plan changes (gateway/platform_accounts.py).
CREATE TABLE plans (
    platform_id         text NOT NULL REFERENCES platforms (id),
    name                text NOT NULL,
    concurrent_jobs     integer NOT NULL CHECK (concurrent_jobs > 0),
    max_queued_jobs     integer CHECK (max_queued_jobs IS NULL OR max_queued_jobs >= 0),
    daily_spend_cap     bigint CHECK (daily_spend_cap IS NULL OR daily_spend_cap >= 0),
    max_job_credits     bigint CHECK (max_job_credits IS NULL OR max_job_credits > 0),
    fallback_models     text[] NOT NULL DEFAULT '{}',
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (platform_id, name)
);

ALTER TABLE accounts
    ADD COLUMN platform_id text REFERENCES platforms (id),
    ADD COLUMN external_id text CHECK (external_id IS NULL OR octet_length(external_id) BETWEEN 1 AND 256),
    ADD COLUMN plan text,
    ADD COLUMN max_queued_jobs integer CHECK (max_queued_jobs IS NULL OR max_queued_jobs >= 0),
    ADD COLUMN disabled_at timestamptz,
    ADD COLUMN closed_at timestamptz;  -- deleted through the API: keys revoked, jobs canceled, purge pending
-- One account per user of a platform: a sign-up retried finds the account the first one made.
CREATE UNIQUE INDEX accounts_platform_external ON accounts (platform_id, external_id) WHERE external_id IS NOT NULL;
CREATE INDEX accounts_platform_listing ON accounts (platform_id, created_at, id);
CREATE INDEX accounts_closed ON accounts (closed_at) WHERE closed_at IS NOT NULL;

-- A browser token's grant: the token itself is signed (gateway/browsertokens.py) and carries this row's id.
-- The row holds what it may do, its credit ceiling and what it has used of it, and who issued it: a token
-- dies with its issuer's key.
CREATE TABLE browser_tokens (
    id             text PRIMARY KEY,
    account_id     text NOT NULL REFERENCES accounts (id),
    issuer_kind    text NOT NULL CHECK (issuer_kind IN ('api_key', 'platform_key')),
    issuer_key_id  text NOT NULL,
    scopes         text[] NOT NULL CHECK (scopes <@ ARRAY['read', 'create', 'upload']::text[]),
    job_ids        text[],  -- NULL: every job of the account
    credit_ceiling bigint CHECK (credit_ceiling IS NULL OR credit_ceiling >= 0),
    credits_used   bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL
);
CREATE INDEX browser_tokens_account ON browser_tokens (account_id);
CREATE INDEX browser_tokens_expires ON browser_tokens (expires_at);

-- Every platform action: who (the platform and its key), what (the route and its target), when, and under
-- which request id. Acting for an account names the account too.
CREATE TABLE platform_audit (
    id              bigserial PRIMARY KEY,
    platform_id     text NOT NULL,
    platform_key_id text NOT NULL,
    action          text NOT NULL,
    account_id      text,
    target          text NOT NULL DEFAULT '',
    status          integer NOT NULL,
    request_id      text NOT NULL,
    at              timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX platform_audit_platform ON platform_audit (platform_id, id);

-- libs/common: credit from a platform ---------------------------------------------------------------------
-- A grant or take-back names the billing provider's event as its idempotency key: the same key is the
-- same change, made once.
ALTER TABLE credit_ledger
    ADD COLUMN idempotency_key text,
    ADD COLUMN platform_key_id text,
    ADD COLUMN request_id text;
CREATE UNIQUE INDEX credit_ledger_idempotency ON credit_ledger (account_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Credit granted (or, negative, taken back) by a platform, for one of its own accounts. The gateway may run
-- it, but it does nothing without the platform key itself: the key is hashed here and must be live and hold
-- the `credits` scope, so a service that misbehaves, holding no key, still cannot add credit. Answers the
-- ledger entry, and whether it was made by an earlier call with the same idempotency key (which must have
-- asked for the same amount). No row for an account the platform does not have.
CREATE FUNCTION platform_credit(p_key text, p_account_id text, p_amount bigint, p_idempotency_key text,
                                p_note text, p_request_id text, OUT entry_id bigint, OUT replayed boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    pkey record;
    earlier record;
    moved record;
BEGIN
    SELECT id, platform_id INTO pkey FROM platform_keys
    WHERE key_hash = sha256(convert_to(p_key, 'UTF8')) AND revoked_at IS NULL
      AND (expires_at IS NULL OR expires_at > now()) AND 'credits' = ANY (scopes);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'platform_credit refuses: not a live platform key with the credits scope'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_amount IS NULL OR p_amount = 0 OR p_idempotency_key IS NULL THEN
        RAISE EXCEPTION 'platform_credit refuses: an amount and an idempotency key are required'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The account's row first, as every credit change locks it: racing calls with one key queue here.
    PERFORM 1 FROM accounts WHERE id = p_account_id AND platform_id = pkey.platform_id AND closed_at IS NULL
        FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT id, balance_change INTO earlier FROM credit_ledger
    WHERE account_id = p_account_id AND idempotency_key = p_idempotency_key;
    IF FOUND THEN
        IF earlier.balance_change <> p_amount THEN
            RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'credit_ledger_idempotency',
                MESSAGE = format('idempotency key %s was used for a change of %s credits', p_idempotency_key,
                                 earlier.balance_change);
        END IF;
        entry_id := earlier.id;
        replayed := true;
        RETURN;
    END IF;
    UPDATE accounts SET credits_balance = credits_balance + p_amount WHERE id = p_account_id
    RETURNING credits_balance, credits_reserved INTO moved;
    INSERT INTO credit_ledger (account_id, kind, balance_change, reserved_change, balance_after, reserved_after,
                               note, idempotency_key, platform_key_id, request_id)
    VALUES (p_account_id, 'grant', p_amount, 0, moved.credits_balance, moved.credits_reserved, p_note,
            p_idempotency_key, pkey.id, p_request_id)
    RETURNING id INTO entry_id;
    replayed := false;
END $$;

-- An account a platform closed (closed_at set, keys revoked, live jobs canceled and ended) loses its rows, as
-- `vidjobs accounts delete --purge` removes them: the tables named, in the order given (children first), each
-- holding an account_id or job_id column of this schema. Refused while a job of the account is live or one
-- of its renders is being copied. Its objects are removed before this runs.
CREATE FUNCTION purge_closed_account(p_account_id text, p_tables text[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    tbl text;
    about text;
    removed bigint := 0;
    n bigint;
BEGIN
    PERFORM 1 FROM accounts WHERE id = p_account_id AND closed_at IS NOT NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM jobs WHERE account_id = p_account_id AND deleted_at IS NULL
               AND status NOT IN ('completed', 'failed', 'canceled', 'expired'))
       OR EXISTS (SELECT 1 FROM media_copies c JOIN jobs j ON j.id = c.job_id
                  WHERE j.account_id = p_account_id AND c.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'purge_closed_account refuses: % still has live jobs or renders being copied', p_account_id
            USING ERRCODE = 'object_in_use';
    END IF;
    PERFORM set_config('vidjobs.purging_account', p_account_id, true);
    FOREACH tbl IN ARRAY p_tables LOOP
        about := NULL;
        IF tbl = 'accounts' THEN
            about := 'id = $1';
        ELSIF tbl = 'jobs' THEN
            about := 'account_id = $1';
        ELSIF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                      AND table_name = tbl AND column_name = 'account_id') THEN
            about := 'account_id = $1';
            IF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                       AND table_name = tbl AND column_name = 'job_id') THEN
                about := about || ' OR job_id IN (SELECT id FROM jobs WHERE account_id = $1)';
            END IF;
        ELSIF EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
                      AND table_name = tbl AND column_name = 'job_id') THEN
            about := 'job_id IN (SELECT id FROM jobs WHERE account_id = $1)';
        END IF;
        IF about IS NULL THEN
            RAISE EXCEPTION 'purge_closed_account refuses: % holds no rows of an account', tbl
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        EXECUTE format('DELETE FROM %I WHERE %s', tbl, about) USING p_account_id;
        GET DIAGNOSTICS n = ROW_COUNT;
        removed := removed + n;
    END LOOP;
    RETURN removed;
END $$;

DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['platform_credit(text, text, bigint, text, text, text)',
                              'purge_closed_account(text, text[])'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
