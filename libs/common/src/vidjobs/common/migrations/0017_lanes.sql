-- rollout: expand: a defaulted column, and two indexes rebuilt with it; the release before it reads and writes jobs as
-- before.
-- Lanes within an account's queue (`priority` in the API): 0 interactive, 1 batch. An account's waiting
-- interactive jobs go ahead of its waiting batch ones, both at a provider (the fair pick's choice of the
-- account's head) and in the account's place numbering; the order across accounts does not look at it.

-- libs/common ------------------------------------------------------------------------------------------
-- A constant default: no rewrite of the table; every existing job is interactive, as every job was. The
-- check reads the table once; a number rather than a text enum so that index order is lane order.
ALTER TABLE jobs ADD COLUMN lane smallint NOT NULL DEFAULT 0 CONSTRAINT jobs_lane_known CHECK (lane IN (0, 1));

-- The waiting-job indexes of 0006 with the lane before the creation time: an account's queue is read from
-- the front in (lane, created_at, id) order, its place counted and its head found by one index range, and
-- the skip scans over providers and accounts still probe the leading columns. The runner applies a
-- migration in one transaction, where CONCURRENTLY cannot run: each build reads the table once while writes
-- to jobs wait, and no moment is left without either index.
DROP INDEX jobs_account_waiting;
CREATE INDEX jobs_account_waiting ON jobs (account_id, lane, created_at, id)
    WHERE status = 'pending' AND deleted_at IS NULL;
DROP INDEX jobs_provider_waiting;
CREATE INDEX jobs_provider_waiting ON jobs (provider, account_id, lane, created_at, id)
    WHERE status = 'pending' AND deleted_at IS NULL;
