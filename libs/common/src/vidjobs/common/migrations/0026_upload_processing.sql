-- rollout: expand: new columns with a default ('ready') or nullable, which the release before it neither writes nor reads.
-- gateway and media: an upload is recorded as `processing` with its raw bytes in quarantine, and the media
-- worker decodes it and marks it `ready` or `rejected` (with `reason`, a code, and `message`, in words).
-- Rows written before this release, and by a gateway of the previous release during a rollout (which still
-- decodes in its own process), are ready when recorded: the default says so.
ALTER TABLE uploads
    ADD COLUMN status text NOT NULL DEFAULT 'ready' CHECK (status IN ('processing', 'ready', 'rejected')),
    ADD COLUMN reason text,
    ADD COLUMN message text;

-- The reaper's look for uploads left processing too long.
CREATE INDEX uploads_processing ON uploads (created_at) WHERE status = 'processing' AND deleted_at IS NULL;
