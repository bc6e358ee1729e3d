-- rollout: expand: a defaulted column and a nullable one, with indexes; a job the release before it ends has no
-- completed_at.
-- What an app developer reads on a job and filters a listing by (API: the job object and GET /v1/jobs).

-- The owner's own labels: a small map of strings, stored and returned as given, filterable.
ALTER TABLE jobs ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}';
-- When the job reached its ending (completed, failed or canceled); expiry later does not move it.
ALTER TABLE jobs ADD COLUMN completed_at timestamptz;
UPDATE jobs j SET completed_at = t.at
FROM (SELECT job_id, min(at) AS at FROM job_transitions
      WHERE to_status IN ('completed', 'failed', 'canceled') GROUP BY job_id) t
WHERE t.job_id = j.id AND j.status IN ('completed', 'failed', 'canceled', 'expired');

-- Listing filters, each served by an index that also gives the newest-first order:
-- by status (one or several), by model, and by a metadata key = value.
CREATE INDEX jobs_account_status_listing ON jobs (account_id, status, created_at DESC, id DESC)
    WHERE deleted_at IS NULL;
CREATE INDEX jobs_account_model_listing ON jobs (account_id, model, created_at DESC, id DESC)
    WHERE deleted_at IS NULL;
CREATE INDEX jobs_metadata ON jobs USING gin (metadata jsonb_path_ops)
    WHERE deleted_at IS NULL AND metadata <> '{}';
