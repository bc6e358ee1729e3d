-- rollout: expand: a nullable column the release before it neither writes nor reads.
-- A render the provider reports for a job no row holds (a failover to an asynchronous standby lost the row
-- after the render was started) is asked to stop at the provider; its callback's provider_answers row
-- (job_id NULL) says when (`vidjobs inbox unmatched`). NULL: nothing was asked (the render had ended already,
-- or the callback named no job id of ours).
ALTER TABLE provider_answers ADD COLUMN stop_asked_at timestamptz;
