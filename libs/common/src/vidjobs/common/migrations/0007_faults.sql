-- rollout: expand: a new table and defaulted or nullable columns the release before it neither reads nor writes.
-- Infrastructure faults (docs/ARCHITECTURE.md "Faults").

-- media ----------------------------------------------------------------------------------------------
-- Who is copying a job's render right now, across every media replica: a second delivery of the same
-- download waits for the first instead of fetching the render again. A copier that dies holds its lease
-- only until `expires_at`; a live one renews it while it works. A lease that expired while its copier was
-- decoding says the render may have killed it: `crashes` counts those, and a render that keeps killing its
-- decoder is given up on, while the other copies that died beside it are not blamed.
CREATE TABLE media_copies (
    job_id     text PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL,
    decoding   boolean NOT NULL DEFAULT false,
    crashes    integer NOT NULL DEFAULT 0
);

-- submitter ------------------------------------------------------------------------------------------
-- A call whose outcome is unclear (a timeout or a dropped connection after the request went out) is not a
-- refusal: the provider may have accepted it. The attempt stays the same, so its idempotency key is reused,
-- and the render is looked up where the provider allows it before any resubmit.
ALTER TABLE provider_submissions ADD COLUMN unclear_calls integer NOT NULL DEFAULT 0;
ALTER TABLE provider_submissions ADD COLUMN unclear_at timestamptz;

-- When a submitter last looked at a waiting job (and deferred its message): while that is recent, the job
-- still has its message, and the recovery check does not publish another.
ALTER TABLE jobs ADD COLUMN waited_at timestamptz;
