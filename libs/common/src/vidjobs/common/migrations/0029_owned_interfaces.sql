-- rollout: expand: new views, functions and a table, which the release before it neither reads nor calls; the direct privileges that release uses stay granted until the next release (grants.FOR_THE_RELEASE_BEFORE).
-- A service reaches a table another service owns only through an interface the owner keeps (grants.INTERFACES;
-- docs/ARCHITECTURE.md "Ownership"): a view that shows what the reader needs, or a function that makes
-- the one change the caller may make. The owner may change its table behind them; the roles of the other
-- services hold no privilege on it (once the release before this one is gone).
-- And the poller keeps what providers told it that the inbox does not hold: poll answers, and which job each
-- stored callback was about, or that it was about none.

-- media ----------------------------------------------------------------------------------------------
-- A job's stored files as the media service recorded them: what the gateway shows as a job's outputs, counts
-- against a storage quota and reports as delivered seconds. A removed file keeps its row, with `deleted_at`.
CREATE VIEW job_files AS
SELECT job_id, kind, key, content_type, bytes, sha256, width, height, duration_s, deleted_at
FROM assets;

-- gateway --------------------------------------------------------------------------------------------
-- Uploads not deleted: the submitter hands a job's image to its provider, the media worker decodes a
-- processing one and keeps a live one's objects.
CREATE VIEW live_uploads AS
SELECT id, account_id, key, content_type, bytes, sha256, width, height, created_at, status, reason, message
FROM uploads
WHERE deleted_at IS NULL;

-- The media worker decoded a processing upload: it is ready, described by its cleaned image. False when it
-- was not processing (a duplicate delivery finished it already, or it was deleted).
CREATE FUNCTION mark_upload_ready(p_upload_id text, p_bytes bigint, p_sha256 text, p_width integer,
                                  p_height integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer;
BEGIN
    UPDATE uploads SET status = 'ready', bytes = p_bytes, sha256 = p_sha256, width = p_width, height = p_height
    WHERE id = p_upload_id AND status = 'processing' AND deleted_at IS NULL;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END $$;

-- The media worker refused a processing upload, saying why (a code and words, the words cut to 500
-- characters). False when it was not processing.
CREATE FUNCTION mark_upload_rejected(p_upload_id text, p_reason text, p_message text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer;
BEGIN
    UPDATE uploads SET status = 'rejected', reason = p_reason, message = left(p_message, 500)
    WHERE id = p_upload_id AND status = 'processing';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END $$;

-- The reaper rejects, at most `p_limit` at a time, uploads still processing `p_older_than_s` after they were
-- made (their message was lost, or the media worker has been down that long); how many. The reason is
-- uploads.REASON_UNPROCESSED, which the API answers as the upload's error code.
CREATE FUNCTION reject_unprocessed_uploads(p_older_than_s double precision, p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer;
BEGIN
    UPDATE uploads SET status = 'rejected', reason = 'image_unprocessed',
                       message = 'the image was not processed in time; upload it again'
    WHERE id IN (
        SELECT id FROM uploads
        WHERE status = 'processing' AND deleted_at IS NULL
          AND created_at < clock_timestamp() - make_interval(secs => p_older_than_s)
        ORDER BY created_at LIMIT p_limit
        FOR UPDATE SKIP LOCKED)
      AND status = 'processing';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- The reaper marks deleted, at most `p_limit` at a time, uploads older than `p_older_than_s` that no live
-- job still needs; how many. (The terminal statuses are states.TERMINAL's.)
CREATE FUNCTION expire_unused_uploads(p_older_than_s double precision, p_limit integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    n integer;
BEGIN
    UPDATE uploads SET deleted_at = clock_timestamp()
    WHERE id IN (
        SELECT u.id FROM uploads u
        WHERE u.deleted_at IS NULL AND u.created_at < clock_timestamp() - make_interval(secs => p_older_than_s)
          AND NOT EXISTS (
              SELECT 1 FROM jobs j
              WHERE j.request->>'input_image' = u.id AND j.deleted_at IS NULL
                AND j.status NOT IN ('completed', 'failed', 'canceled', 'expired'))
        ORDER BY u.created_at LIMIT p_limit
        FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- Nobody but their owner runs these until libs/common/grants.py grants EXECUTE to the service that calls
-- each; each looks its tables up in this schema only (as 0014's functions do).
DO $$
DECLARE
    fn text;
BEGIN
    FOREACH fn IN ARRAY ARRAY['mark_upload_ready(text, bigint, text, integer, integer)',
                              'mark_upload_rejected(text, text, text)',
                              'reject_unprocessed_uploads(double precision, integer)',
                              'expire_unused_uploads(double precision, integer)'] LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;

-- poller ---------------------------------------------------------------------------------------------
-- What providers told the poller (vidjobs.poller.records): a status poll's answer, a run of identical answers
-- in one row (`answers` counts them, `last_at` is the latest, `signal` is the latest as read); and each stored
-- callback it handled, with the job it was about, or none (`job_id` NULL: a callback for an unknown render).
-- Bounded: a signal's strings are cut before they are kept, a job keeps its newest
-- VIDJOBS_PROVIDER_ANSWERS_PER_JOB rows, and rows go after VIDJOBS_WEBHOOK_RETENTION_DAYS, as the inbox's do.
CREATE TABLE provider_answers (
    id              bigserial PRIMARY KEY,
    kind            text NOT NULL CHECK (kind IN ('poll', 'callback')),
    provider        text NOT NULL,
    provider_job_id text,
    job_id          text REFERENCES jobs (id) ON DELETE CASCADE,
    inbox_id        bigint,  -- the stored callback (webhook_inbox.id, pruned on its own), for a callback
    state           text NOT NULL,
    signal          jsonb NOT NULL,
    answers         integer NOT NULL DEFAULT 1 CHECK (answers >= 1),
    first_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((kind = 'callback') = (inbox_id IS NOT NULL))
);
CREATE INDEX provider_answers_job ON provider_answers (job_id, id);
CREATE UNIQUE INDEX provider_answers_callback ON provider_answers (inbox_id);
CREATE INDEX provider_answers_unmatched ON provider_answers (id) WHERE kind = 'callback' AND job_id IS NULL;
CREATE INDEX provider_answers_last ON provider_answers (last_at);
