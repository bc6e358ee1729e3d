-- rollout: expand: an index only; the release before it never uses it.
-- App webhook deliveries claimed host by host (services/gateway/appwebhooks/claims.py): when an account's
-- oldest due deliveries are the backlog of hosts whose room is taken, the claim reads the account's other
-- hosts' first due deliveries instead of reading past that backlog.

-- gateway --------------------------------------------------------------------------------------------
-- Each account's pending deliveries by host, each host's in due order: the claim walks an account's hosts
-- (a loose index scan) and reads the first few due deliveries of each. The runner applies a migration in
-- one transaction, where CONCURRENTLY cannot run: the build reads the table once while writes
-- to webhook_deliveries wait.
CREATE INDEX webhook_deliveries_account_host_due ON webhook_deliveries (account_id, host, next_attempt_at, id)
    WHERE status = 'pending';
