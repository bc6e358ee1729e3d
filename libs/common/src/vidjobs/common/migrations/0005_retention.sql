-- rollout: expand: indexes only.
-- Retention: completed jobs are expired once their original has been kept long enough. The reaper finds
-- them oldest first; a completed job's updated_at is when it completed (nothing else writes to it after).
CREATE INDEX jobs_retention_due ON jobs (updated_at) WHERE status = 'completed' AND deleted_at IS NULL;
-- Uploads past retention are expired unless a live job still names them as its input image.
CREATE INDEX jobs_input_image ON jobs ((request->>'input_image')) WHERE request->>'input_image' IS NOT NULL;
