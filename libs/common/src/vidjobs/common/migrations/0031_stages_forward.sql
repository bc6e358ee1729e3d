-- rollout: expand: a new enum type, a jobs column with a constant default, and nullable columns; the release before it reads none of them.
-- The stage people see only moves forward (docs/ARCHITECTURE.md "Job states"): a retried job keeps the stage
-- it had reached, which its status alone no longer says, so each move stores it (vidjobs.common.transitions).
-- Rows from before, and moves made by the release before this one, keep the default or leave NULL: a read
-- takes the later of what is stored and the status's own stage (states.stage_after), as before this column.
CREATE TYPE job_stage AS ENUM (
    'queued', 'submitted', 'rendering', 'downloading', 'ready', 'failed', 'canceled', 'expired'
);
ALTER TABLE jobs
    ADD COLUMN stage job_stage NOT NULL DEFAULT 'queued',
    -- What ended the try before the one at hand (the error it was retried for), kept after the error itself
    -- is cleared for the next attempt: the job's `retry` in the API. NULL while on its first try.
    ADD COLUMN retry_error jsonb;
-- The stage after each move; NULL for creation and for moves of the release before this one.
ALTER TABLE job_transitions ADD COLUMN stage job_stage;
