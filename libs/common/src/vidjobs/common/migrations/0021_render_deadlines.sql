-- rollout: expand: a nullable column the release before it neither writes nor reads.
-- Render deadlines from each model's measured renders, the `render_timeout` ending, and reruns.

-- libs/common ------------------------------------------------------------------------------------------
-- The job this one renders again (POST /v1/jobs/{id}/rerun), shown as `rerun_of`; NULL for every other job,
-- and for every job created before it existed. Not a foreign key: the original may be removed for good by
-- retention while its rerun lives on, and the id then names a job that is gone, as a deleted one does.
ALTER TABLE jobs ADD COLUMN rerun_of text;

-- services/gateway ------------------------------------------------------------------------------------
-- Whether a new job renders again what its account had ready (vidjobs.common.regenerations): the account's
-- jobs of the model that were ready, newest first, probed once per create within the window.
CREATE INDEX jobs_account_model_ready ON jobs (account_id, model, completed_at DESC)
    WHERE status IN ('completed', 'expired');
