-- rollout: expand: a defaulted column and an index; a move the release before it makes leaves stage_at as it was.
-- Operating it (libs/common/metrics.py, services/reaper/gauges.py): when each job entered the stage people
-- see it in (states.STAGE_OF), so that a stuck job shows as the oldest in its stage, and a stage's duration
-- can be measured when the job leaves it.

-- libs/common ------------------------------------------------------------------------------------------
-- Added without a default first, then given one: no rewrite of the table, finished jobs keep NULL.
ALTER TABLE jobs ADD COLUMN stage_at timestamptz;
ALTER TABLE jobs ALTER COLUMN stage_at SET DEFAULT now();
-- A live job's last move is the best record there is of when its stage began.
UPDATE jobs j SET stage_at = COALESCE((SELECT max(t.at) FROM job_transitions t WHERE t.job_id = j.id), j.updated_at)
WHERE j.status IN ('pending', 'retrying', 'submitted', 'processing', 'downloading') AND j.deleted_at IS NULL;

-- Unfinished jobs by status, oldest stage first: the gauges count them and find the oldest per stage from this
-- index alone, however many finished jobs the table holds.
CREATE INDEX jobs_unfinished ON jobs (status, stage_at)
    WHERE status IN ('pending', 'retrying', 'submitted', 'processing', 'downloading') AND deleted_at IS NULL;
