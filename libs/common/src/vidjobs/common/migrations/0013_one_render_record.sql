-- rollout: contract: drops jobs.outputs, which the release before it reads and writes: its gateway answers 500 for a
-- finished job and its media cannot complete a copy until it is replaced.
-- split: expand = a release that writes the asset rows and stops reading jobs.outputs (the column kept);
-- contract = the drop, in the release after it, once no pod of the first one is left.
-- A finished render is recorded once, in the media service's asset rows (libs/common/renders.py): the job row's
-- `outputs` copy goes. Every job this code ever completed already has its rows (media wrote them in the same
-- transaction as the copy), so the fill below is only a guard against a row-only job written by hand or by a
-- tool: none loses its files on upgrade.

-- media ----------------------------------------------------------------------------------------------
-- The rows a job lacks, from its copy. What the copy never held is written as unknown: a thumbnail's or a
-- preview's size in bytes (0) and checksum (''). A file already gone is recorded as gone, so the orphan sweep
-- still treats it as removed: all of a deleted job's, an expired job's video and preview.
INSERT INTO assets (job_id, account_id, kind, key, content_type, bytes, sha256, width, height, duration_s,
                    deleted_at)
SELECT j.id, j.account_id, f.kind, f.key, f.content_type, f.bytes, f.sha256, f.width, f.height, f.duration_s,
       CASE WHEN j.deleted_at IS NOT NULL THEN j.deleted_at
            WHEN j.status = 'expired' AND f.kind <> 'thumbnail' THEN j.updated_at END
FROM jobs j
CROSS JOIN LATERAL (VALUES
    ('video', j.outputs ->> 'video_key', 'video/mp4', (j.outputs ->> 'bytes')::bigint, j.outputs ->> 'sha256',
     (j.outputs ->> 'width')::integer, (j.outputs ->> 'height')::integer, (j.outputs ->> 'duration_s')::float8),
    ('thumbnail', j.outputs ->> 'thumbnail_key', 'image/jpeg', 0, '',
     (j.outputs ->> 'thumbnail_width')::integer, (j.outputs ->> 'thumbnail_height')::integer, NULL),
    ('preview', j.outputs ->> 'preview_key', 'video/mp4', 0, '',
     (j.outputs ->> 'preview_width')::integer, (j.outputs ->> 'preview_height')::integer,
     (j.outputs ->> 'preview_duration_s')::float8)
) AS f (kind, key, content_type, bytes, sha256, width, height, duration_s)
WHERE j.outputs IS NOT NULL AND f.key IS NOT NULL
ON CONFLICT ON CONSTRAINT assets_one_per_kind DO NOTHING;

-- libs/common ------------------------------------------------------------------------------------------
ALTER TABLE jobs DROP COLUMN outputs;
