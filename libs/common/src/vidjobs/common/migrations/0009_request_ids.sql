-- rollout: expand: nullable columns; rows the release before it writes carry no request id.
-- Request ids (libs/common/requestids.py): the request that caused an event travels with it, and a job
-- keeps the request that created it, for the work no client request causes (callbacks, recovery).
ALTER TABLE outbox ADD COLUMN request_id text;
ALTER TABLE jobs ADD COLUMN request_id text;
