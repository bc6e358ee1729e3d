-- rollout: expand: the ledger's append-only rule keeps refusing everything the release before it could do, and makes one exception that release never asks for.
-- A data-deletion request removes an account with everything it left, its credit ledger included
-- (`vidjobs accounts delete --purge`, run as the schema's owner). The ledger stays append-only for every
-- other purpose: an update or a truncate is refused as before, and a delete only of the entries of the one
-- account the purging transaction names in `vidjobs.purging_account` (set with SET LOCAL, so it ends with
-- that transaction). No service role holds DELETE on the ledger, so none can use the exception.

CREATE OR REPLACE FUNCTION credit_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.account_id = current_setting('vidjobs.purging_account', true) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'credit_ledger is append-only: write a new entry instead of changing %', TG_OP;
END $$;
