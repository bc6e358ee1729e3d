-- rollout: expand: a new table and its index; the release before it never touches them.
-- gateway: images uploaded as image-to-video input. The gateway writes the rows; the submitter reads them to
-- hand the provider a signed URL. `key` is derived from account and id, never from anything the client sent.
-- An object under accounts/*/uploads/ without a live row here is an orphan, and the sweep removes it.
CREATE TABLE uploads (
    id           text PRIMARY KEY,
    account_id   text NOT NULL REFERENCES accounts (id),
    key          text NOT NULL,
    content_type text NOT NULL CHECK (content_type IN ('image/png', 'image/jpeg', 'image/webp')),
    bytes        bigint NOT NULL CHECK (bytes > 0),
    sha256       text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    width        integer NOT NULL CHECK (width > 0),
    height       integer NOT NULL CHECK (height > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    deleted_at   timestamptz,
    CONSTRAINT uploads_key_unique UNIQUE (key)
);

-- An account's live uploads, newest first.
CREATE INDEX uploads_account ON uploads (account_id, created_at DESC) WHERE deleted_at IS NULL;
