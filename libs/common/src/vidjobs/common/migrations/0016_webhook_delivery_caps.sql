-- rollout: expand: nullable or defaulted columns and indexes; a delivery the release before it makes has no host.
-- Webhooks to apps, bounded per account and per host (services/gateway/appwebhooks/deliveries.py): what is
-- in flight is visible to every gateway replica, so the caps hold across them; deliveries whose endpoint is
-- gone are never claimed; manual retries are counted; old history is pruned.

-- gateway --------------------------------------------------------------------------------------------
-- The host (and port) a delivery goes to: in-flight limits count hosts, not URL spellings.
ALTER TABLE webhook_deliveries ADD COLUMN host text;
UPDATE webhook_deliveries
SET host = lower(substring(url FROM '^[A-Za-z][A-Za-z0-9+.-]*://(?:[^@/?#]*@)?([^/?#]+)'));
-- Set while an attempt is under way (its claim), cleared when it settles: in flight, for every replica.
ALTER TABLE webhook_deliveries ADD COLUMN claimed_until timestamptz;
ALTER TABLE webhook_deliveries ADD COLUMN manual_retries integer NOT NULL DEFAULT 0;

-- Each account's due deliveries in order, reached one account at a time by the claim.
CREATE INDEX webhook_deliveries_account_due ON webhook_deliveries (account_id, next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_in_flight ON webhook_deliveries (claimed_until)
    WHERE claimed_until IS NOT NULL;
-- Finished history, oldest first, for the retention prune.
CREATE INDEX webhook_deliveries_finished ON webhook_deliveries (updated_at) WHERE status <> 'pending';

-- Attempts in the last minute, per account: the per-minute cap.
ALTER TABLE webhook_attempts ADD COLUMN account_id text;
CREATE INDEX webhook_attempts_recent ON webhook_attempts (at, account_id);
