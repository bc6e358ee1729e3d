-- rollout: expand: one nullable column the release before it neither reads nor writes.
-- libs/common: where a submitted job stands in its provider's own queue, as the provider last said.
ALTER TABLE jobs ADD COLUMN provider_queue_position integer CHECK (provider_queue_position >= 0);
