-- rollout: expand: indexes only.
-- Limits on what one client or one impostor can cost everyone else (docs/ARCHITECTURE.md "Tenancy").

-- gateway --------------------------------------------------------------------------------------------
-- Stored callbacks are pruned after VIDJOBS_WEBHOOK_RETENTION_DAYS, oldest first.
CREATE INDEX webhook_inbox_received ON webhook_inbox (received_at);
-- Uploads per account per UTC day, counted whether or not the upload was deleted since.
CREATE INDEX uploads_account_day ON uploads (account_id, created_at);

-- libs/common ----------------------------------------------------------------------------------------
-- A callback is stored only when it names a render of ours: one a live job uses (jobs_provider_ref), or,
-- for a verified callback, possibly one whose submit is still waiting for the provider's answer.
CREATE INDEX provider_submissions_in_flight ON provider_submissions (provider, claimed_at)
    WHERE answered_at IS NULL;
