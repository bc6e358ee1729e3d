-- rollout: expand: a nullable column and an index the release before it never uses.
-- Estimated start and ready times of waiting jobs (libs/common/estimates.py), from what this deployment
-- measured of each model's renders.

-- libs/common ------------------------------------------------------------------------------------------
-- When the job's render last let go of its provider slot (it moved out of submitted/processing): a render
-- holds its slot from `submitted_at` until then, and is ready at `completed_at`. NULL on jobs that never left
-- a slot, and on those that did before it existed (a render's hold is then taken as its time to ready).
ALTER TABLE jobs ADD COLUMN rendered_at timestamptz;

-- A model's most recently completed jobs, newest first: the renders an estimate is measured from, read from
-- the front of the index however many jobs the table holds (no other index leads with the model).
CREATE INDEX jobs_model_completed ON jobs (model, completed_at DESC) WHERE status = 'completed';
