-- rollout: expand: nullable columns, a table and an index the release before it neither reads nor writes.
-- Keeping a clip past retention, the warning before retention removes one, and exports of a stored original
-- to the account's own bucket (docs/KEEPING.md).

-- libs/common ----------------------------------------------------------------------------------------
-- A kept job is passed over by retention until its owner releases it (NULL: not kept).
ALTER TABLE jobs ADD COLUMN kept_at timestamptz;
-- When its app was told `job.expiring`; cleared when it is released, so its new window is told of again.
ALTER TABLE jobs ADD COLUMN expiry_warned_at timestamptz;
-- Retention counts from completed_at (0010), no longer from updated_at. 0010 filled it from each job's
-- trail; a completed job with none there gets the moment it was last changed, which is when it completed.
UPDATE jobs SET completed_at = updated_at WHERE status = 'completed' AND completed_at IS NULL;
-- The reaper's warnings and expiries, oldest first. 0005's jobs_retention_due serves the release before
-- this one; dropping it is a later release's contract.
CREATE INDEX jobs_retention_from_completed ON jobs (completed_at)
    WHERE status = 'completed' AND deleted_at IS NULL AND kept_at IS NULL;
-- An account's kept clips, for its storage quota.
CREATE INDEX jobs_account_kept ON jobs (account_id) WHERE kept_at IS NOT NULL AND deleted_at IS NULL;

-- gateway --------------------------------------------------------------------------------------------
-- The most the account's kept clips may hold; NULL: VIDJOBS_STORAGE_QUOTA_BYTES.
ALTER TABLE accounts ADD COLUMN storage_quota_bytes bigint CHECK (storage_quota_bytes >= 0);

-- media ----------------------------------------------------------------------------------------------
-- One copy of a job's stored original to a presigned PUT URL of the account's own. The gateway writes the
-- row (with its request in the outbox); the media service copies and settles it.
CREATE TABLE job_exports (
    id          text PRIMARY KEY,                   -- exp_...
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    account_id  text NOT NULL REFERENCES accounts (id),
    url         text,                               -- the presigned URL; cleared once the export is over
    host        text NOT NULL,                      -- where it goes, shown with its status
    status      text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'failed')),
    reason      text,                               -- why it failed, or what the last try met
    attempts    integer NOT NULL DEFAULT 0,
    bytes       bigint,                             -- sent, once done
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    CHECK ((status = 'pending') = (finished_at IS NULL))
);
CREATE INDEX job_exports_job ON job_exports (job_id, created_at DESC);
CREATE INDEX job_exports_account_pending ON job_exports (account_id) WHERE status = 'pending';
