-- rollout: expand: a nullable column the release before it neither writes nor reads.
-- A provider callback is parsed once: the gateway that verified it stores the signal it read beside the raw
-- body, and the poller acts on that signal instead of parsing the body again.
-- Safe beside the release before it: a nullable column that release neither writes nor reads. NULL is a row
-- stored before this column existed, or by a gateway of that release during a rollout; the poller parses
-- such a row's raw body, as it always did.
ALTER TABLE webhook_inbox ADD COLUMN signal jsonb;
